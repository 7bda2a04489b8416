"""Checkpoint files that prove they are intact: each is written atomically (temporary file, then rename)
with a sidecar holding its SHA-256, and read back only when the hash matches. Atomic renames already
keep a crash from leaving half a file under the real name; the hash catches what they cannot (a copy
cut short, a disk that lost blocks, a file edited by hand). The training state keeps its previous
version too, so a damaged latest one costs one checkpoint interval, not the run.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO, Any

from dpsynth.models.errors import ConfigError, StorageError


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def previous(path: Path) -> Path:
    return path.with_name(path.stem + ".prev" + path.suffix)


def write_text_atomic(text: str, path: Path) -> None:
    """Write `text` to a temporary file, then rename it over `path`: readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _HashingWriter:
    """A binary file that hashes what is written through it, so that a checkpoint's SHA-256 costs no
    second pass over a file of hundreds of megabytes (torch.save writes a file object front to back)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.name = handle.name  # the file's path, as a file object has it
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self._handle.write(data)

    def flush(self) -> None:
        self._handle.flush()


def spare(path: Path) -> Path:
    """The file of the version a `keep_previous` save dropped, kept to be overwritten by the next save."""
    return path.with_name(path.stem + ".spare" + path.suffix)


def save_verified(obj: object, path: Path, keep_previous: bool = False, zip_crc32: bool = True) -> str:
    """torch.save `obj` to `path` with its hash beside it; returns the hash. `keep_previous` first moves
    the current file (and its hash) to `<stem>.prev<suffix>`; the version that was there is dropped, its
    file kept as `<stem>.spare<suffix>` for the next save to overwrite in place: allocating a file of
    hundreds of megabytes costs more than writing it, and the current and previous versions stay whole
    while the new one is written. `zip_crc32=False` skips the zip records' CRC-32 (torch.load does not
    need it; the SHA-256 already proves the file intact): for the large internal training states, where
    it costs a tenth of a second per checkpoint."""
    import torch  # here, not at import: stages hash files with this module without needing torch
    from torch.utils.serialization import config

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    mode = "wb"
    if keep_previous and spare(path).exists():
        os.replace(spare(path), tmp)
        mode = "r+b"
    try:
        # torch's config modules gain patch() at import (install_config_module), which its stubs omit.
        with open(tmp, mode) as handle, config.patch({"save.compute_crc32": zip_crc32}):  # type: ignore[attr-defined]
            writer = _HashingWriter(handle)
            # torch.save takes any object with write() and flush() (its documented contract); its
            # annotation names only paths and IO[bytes].
            torch.save(obj, writer)  # type: ignore[arg-type]
            handle.truncate()
    except OSError as exc:
        if exc.filename is None:  # a failed write (a full disk) names no file: name the checkpoint's
            raise OSError(exc.errno, exc.strerror, str(tmp)) from exc
        raise
    digest = writer.digest.hexdigest()
    if keep_previous and path.exists() and sidecar(path).exists():
        if previous(path).exists():
            os.replace(previous(path), spare(path))
            sidecar(previous(path)).unlink(missing_ok=True)
        os.replace(path, previous(path))
        os.replace(sidecar(path), sidecar(previous(path)))
    os.replace(tmp, path)
    write_text_atomic(digest, sidecar(path))
    return digest


def save_training_state(state: dict, path: Path) -> str:
    """A trainer's resumable state: the previous version kept, no zip CRC-32 (internal, large, and proven
    intact by its SHA-256)."""
    return save_verified(state, path, keep_previous=True, zip_crc32=False)


def damaged_reason(path: Path, expected: str | None = None) -> str | None:
    """Why `path` cannot be trusted (missing, no recorded hash, hash mismatch), or None when intact.
    `expected`: the hash recorded elsewhere (e.g. in the training ledger); else the sidecar's."""
    path = Path(path)
    if not path.exists():
        return "it is missing"
    if expected is None:
        try:
            expected = sidecar(path).read_text().strip()
        except FileNotFoundError:
            return "its recorded hash is missing"
    if sha256_of(path) != expected:
        return "its content does not match its recorded SHA-256 (truncated or damaged)"
    return None


def load_verified(path: Path, expected: str | None = None, **torch_load_args: Any) -> Any:
    """torch.load `path` after checking it against its recorded hash; StorageError naming it otherwise."""
    reason = damaged_reason(path, expected)
    if reason is not None:
        raise StorageError(
            f"The checkpoint file {str(path)!r} cannot be used: {reason}. Remove the stage folder "
            f"that holds it ({str(Path(path).parent)!r}) and rerun: that stage is redone from its "
            "inputs, with the run's secret."
        )
    import torch

    return torch.load(path, **torch_load_args)


def load_latest_intact(path: Path, **torch_load_args: Any) -> tuple[Any, Path | None, list[str]]:
    """The newest intact version of a `keep_previous` file: (object, file used, problems met on the way);
    (None, None, problems) when neither the file nor its previous version is intact. The object is
    whatever torch.load unpickles."""
    import torch

    problems: list[str] = []
    for candidate in (Path(path), previous(Path(path))):
        if not candidate.exists() and not sidecar(candidate).exists():
            continue
        reason = damaged_reason(candidate)
        if reason is None:
            return torch.load(candidate, **torch_load_args), candidate, problems
        problems.append(f"{candidate.name}: {reason}")
    return None, None, problems


def resume_state(
    path: Path, position: str = "iteration", written_for: dict | None = None
) -> tuple[dict | None, list[str]]:
    """A trainer's newest intact training state (`load_latest_intact`, on CPU: RNG states must stay there)
    and notes for a person: what was damaged, and where training resumes (`state[position]`).
    `written_for`: entries the state must hold unchanged (its configuration, its row count), else
    ConfigError: a state written for another run must never be continued."""
    state, used, problems = load_latest_intact(path, map_location="cpu", weights_only=False)
    if state is not None and written_for and any(state.get(k) != v for k, v in written_for.items()):
        raise ConfigError(
            f"the training state in {str(Path(path).parent)!r} was written by another configuration "
            "or table; resume with the same ones, or start a new run folder"
        )
    notes = list(problems)
    if state is None:
        if problems:
            notes.append(f"no intact training state: training restarts from {position} 0")
    elif problems:
        assert used is not None  # a state was loaded, so from a file
        notes.append(f"resumed from {used.name} ({position} {state[position]})")
    return state, notes
