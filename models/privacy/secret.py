"""The per-run secret behind every random choice that protects privacy.

The Gaussian noise of the sanitiser, the critic each sanitised row queries, the split of the table and
the partition of the training rows among the critics must be unpredictable: with a seed written in a
profile, anyone who knows the code and the other rows could replay training and test a row's
membership exactly. So each run draws 32 bytes from the operating system's CSPRNG (`secrets`) and keeps
them only in its internal run folder (owner-only), where a resumed run finds them again and continues
exactly. The profile's seed still fixes every other random choice (initialisation, latents, the
critics' own batches), which does not need to be secret.

Each use derives its own stream with HMAC-SHA256(secret, purpose), so streams for different purposes
are independent and none reveals the secret. The derived seeds feed ordinary generators (PCG64 for
numpy; torch's Mersenne Twister, seeded with 63 bits): their outputs are never published directly,
only through the noise they protect.

A `PrivacySecret` never shows its value in `repr`, `str` or logs. Tests pass a fixed one explicitly
(`PrivacySecret.from_hex`); a release always creates its own (`load_or_create` on a new run folder).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from dpsynth.models.errors import MissingInputError

if TYPE_CHECKING:
    import torch

SECRET_BYTES = 32
SECRET_FILE = "privacy_secret"


class PrivacySecret:
    """32 secret bytes; derives independent, reproducible random streams by purpose."""

    __slots__ = ("_value",)

    def __init__(self, value: bytes):
        if not isinstance(value, bytes) or len(value) < 16:
            raise ValueError("a privacy secret must be at least 16 bytes")
        self._value = value

    @classmethod
    def generate(cls) -> PrivacySecret:
        """A fresh secret from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> PrivacySecret:
        """A fixed secret, for tests that need determinism (a release never takes one)."""
        return cls(bytes.fromhex(text))

    def _digest(self, purpose: str) -> bytes:
        return hmac.new(self._value, purpose.encode(), hashlib.sha256).digest()

    def seed(self, purpose: str) -> int:
        """A 63-bit seed for `purpose`, independent of every other purpose's."""
        return int.from_bytes(self._digest(purpose)[:8], "little") & ((1 << 63) - 1)

    def numpy(self, purpose: str) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(int.from_bytes(self._digest(purpose)[:16], "little")))

    def torch(self, purpose: str, device: torch.device | str = "cpu") -> torch.Generator:
        # Imported here: the budget and ledger checks import this module, and a refusal should not
        # spend a second loading torch (only training draws torch streams).
        import torch

        return torch.Generator(device=device).manual_seed(self.seed(purpose))

    def __repr__(self) -> str:
        return "PrivacySecret(<hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        # Never pickled into task parameters, results or caches: read it from the run folder instead.
        raise TypeError("a PrivacySecret is not serialisable; stages read it from the run folder")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacySecret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        return hash(self._digest("hash"))


def secret_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / SECRET_FILE


def load_or_create(run_dir: str | Path) -> PrivacySecret:
    """The run's secret: read from the run folder, or drawn and written there (mode 0600) on first use.

    The file is written whole under a private temporary name, then hard-linked into place (which fails
    if it exists), so two processes starting the same run folder agree on one secret and neither ever
    reads half a file."""
    path = secret_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fresh = PrivacySecret.generate()
        tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(fresh._value.hex())
                handle.flush()
                os.fsync(handle.fileno())
            os.link(tmp, path)
            return fresh
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return load(run_dir)


def load(run_dir: str | Path) -> PrivacySecret:
    """The secret of an existing run folder."""
    path = secret_path(run_dir)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise MissingInputError(
            f"The run folder {str(Path(run_dir))!r} has no privacy secret; it was not "
            "started by dpsynth, or its secret was removed (then it cannot be resumed: "
            "start a new run)."
        ) from None
    try:
        return PrivacySecret.from_hex(text)
    except ValueError:
        raise MissingInputError(
            f"The privacy secret of {str(Path(run_dir))!r} is damaged; the run cannot be "
            "resumed exactly: start a new run."
        ) from None


def store(run_dir: str | Path, secret: PrivacySecret) -> None:
    """Put a given secret into a new run folder (mode 0600): for tests that need two runs to share one.
    Refuses a folder that already has a secret; dpsynth's own runs always draw theirs (`load_or_create`)."""
    path = secret_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret._value.hex())
