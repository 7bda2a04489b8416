"""The installation's home: one owner-only folder that holds the privacy ledger, the internal MLflow
store, the registry store and the run folders, whatever folder a command runs from.

`DPSYNTH_HOME` (or the command line's `--home`, which sets it) names it; the default is `~/.dpsynth`.
The ledger must not depend on the working folder: a `cd` would otherwise start a table's lifetime budget
afresh. With a tracking store that is not a local file (an MLflow server), the home must be named
explicitly: the ledger and the run folders stay on this machine, and a default chosen silently could
differ between the machines that share the server.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpsynth.models.errors import ConfigError

HOME_VARIABLE = "DPSYNTH_HOME"
DEFAULT_HOME = "~/.dpsynth"


def home_is_explicit() -> bool:
    return bool(os.environ.get(HOME_VARIABLE))


def home() -> Path:
    """The home folder (absolute), created owner-only if missing."""
    from dpsynth.tasks.private_files import private_dir

    return private_dir(Path(os.environ.get(HOME_VARIABLE) or DEFAULT_HOME).expanduser().resolve())


def set_home(path: str | Path) -> Path:
    """Make `path` the home of this process and of every process it starts (flows, workers)."""
    os.environ[HOME_VARIABLE] = str(Path(path).expanduser().resolve())
    return home()


def require_explicit_home_for(tracking_uri: str) -> None:
    """Refuse a remote tracking store without an explicit home (see the module's docstring)."""
    if not tracking_uri.startswith("sqlite:///") and not home_is_explicit():
        raise ConfigError(
            f"The MLflow tracking store {tracking_uri} is not a local file, so dpsynth needs its home named "
            f"explicitly: set {HOME_VARIABLE} (or pass --home) to the folder that keeps this installation's "
            "privacy ledger and run folders. Nothing was started."
        )
