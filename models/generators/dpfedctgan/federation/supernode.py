"""`flower-supernode` as the launcher starts it for a local site, and `flower-superexec` as the SuperLink and the
SuperNodes start it: Flower's own entry points, with shorter waits between their polls.

Flower 1.32's SuperNode (`flwr.supernode.start_client_internal`) sleeps a fixed 3 s whenever a pull from the
SuperLink brings no message, and 0.5 s between its checks for a reply to push. A site pulls right after it
pushes a round's reply, before the server has the other sites' replies and the next round's weights, so every
round waited up to 3 s more on every site. Here every sleep of that module (and of no other) lasts at most
`PULL_SECONDS`: a pull is one gRPC call to the SuperLink on loopback. Nothing else of the SuperNode changes; a
Flower whose module has no `time` to shorten runs unchanged (slower, not wrong). SuperNodes on other
machines (`local_clients: false`) run Flower's plain `flower-supernode` (docs/generators.md).

The SuperExec (`flwr.supercore.superexec.run_superexec`) that the SuperLink starts for the ServerApp, and each
local SuperNode for its ClientApps, asks its parent for an app to launch once a second: every round's message
waited up to 1 s on every site before its ClientApp started. Its sleeps last at most `LAUNCH_POLL_SECONDS`
(one gRPC call on loopback each time). The launcher puts a `flower-superexec` of its own first on the PATH
of the processes it starts (`write_superexec`), which runs `superexec_main`.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

PULL_SECONDS = 0.5  # as Flower's own wait for a reply; a pull, logged by the SuperLink, twice a second a site
LAUNCH_POLL_SECONDS = 0.2  # a SuperExec's question to its own parent, on loopback, five times a second
SUPEREXEC = "flower-superexec"  # the command name the SuperLink and the SuperNodes start it by (on PATH)


class ShortSleeps:
    """The `time` module, except that `sleep` lasts at most `cap` seconds."""

    def __init__(self, cap: float):
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def shorten_sleeps(module: ModuleType, cap: float = PULL_SECONDS) -> bool:
    """`module`'s sleeps at most `cap` seconds (its global `time` replaced); False if it has no `time` module."""
    if getattr(module, "time", None) is not time:
        return False
    module.time = ShortSleeps(cap)  # type: ignore[attr-defined]
    return True


def write_superexec(bin_dir: Path) -> Path:
    """`bin_dir/flower-superexec` (mode 0700): runs `superexec_main` with this interpreter; its path."""
    from dpsynth.models.generators.dpfedctgan.federation.guard import write_wrapper_script

    # -P: no working directory on sys.path (the process's cwd is not ours to trust).
    return write_wrapper_script(
        bin_dir / SUPEREXEC, f'exec {shlex.quote(sys.executable)} -P -m {__name__} superexec "$@"'
    )


def superexec_main() -> None:
    from flwr.supercore.cli import flower_superexec
    from flwr.supercore.superexec import run_superexec

    shorten_sleeps(run_superexec, LAUNCH_POLL_SECONDS)
    sys.argv[0] = SUPEREXEC
    flower_superexec()


def main() -> None:
    if sys.argv[1:2] == ["superexec"]:
        del sys.argv[1]
        superexec_main()
        return
    from flwr.supernode import start_client_internal
    from flwr.supernode.cli.flower_supernode import flower_supernode

    shorten_sleeps(start_client_internal)
    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
