"""Stage folders and manifests: how a run records, finds and skips completed work.

Every stage writes into `<run_dir>/<stage>/` and finishes by writing `manifest.json` (input hashes,
config hash, outputs, timings). A rerun with the same inputs and config finds the manifest and skips
the stage; anything else (no manifest, a changed input, a missing output) runs it again. Outputs are
written before the manifest, so a crash or a kill never leaves a manifest that lies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpsynth.models.checkpoint_files import sha256_of
from dpsynth.tasks.memory import heap_frozen_during_stage, return_freed_memory

MANIFEST = "manifest.json"


sha256_file = sha256_of  # one file hash for stages and checkpoints


def sha256_path(path: Path) -> str:
    """Hash of a file, or of a folder's files (names and contents, in sorted order)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.endswith(".tmp")):
        digest.update(str(child.relative_to(path)).encode())
        digest.update(sha256_file(child).encode())
    return digest.hexdigest()


def sha256_json(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def write_json(obj: object, path: Path) -> Path:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, default=_json_default))
    os.replace(tmp, path)
    return path


def _json_default(value: object) -> object:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


@dataclass(frozen=True)
class StageResult:
    name: str
    directory: Path
    outputs: dict[str, Path]
    skipped: bool
    seconds: float
    info: dict

    def __getitem__(self, key: str) -> Path:
        return self.outputs[key]


def run_stage(
    run_dir: Path,
    name: str,
    inputs: dict[str, Path],
    config: dict,
    work: Callable[[Path], tuple[dict[str, Path], dict]],
) -> StageResult:
    """Run `work(stage_dir) -> (outputs, info)` unless a valid manifest says it is already done."""
    directory = Path(run_dir) / name
    directory.mkdir(parents=True, exist_ok=True)
    input_hashes = {key: sha256_path(Path(p)) for key, p in sorted(inputs.items())}
    config_hash = sha256_json(config)
    manifest_path = directory / MANIFEST
    if manifest_path.exists():
        manifest = read_json(manifest_path)
        outputs = {k: directory / v for k, v in manifest["outputs"].items()}
        if (
            manifest.get("inputs") == input_hashes
            and manifest.get("config_hash") == config_hash
            and all(p.exists() for p in outputs.values())
        ):
            from dpsynth.tasks.progress import note

            if "/" not in name:  # one selection run of many ("evaluate-k10/003") shows on the progress display
                note(f"{name}: reused (completed {manifest.get('started', '')[:19]}, same inputs and settings)")
            return StageResult(name, directory, outputs, True, manifest["seconds"], manifest.get("info", {}))
        manifest_path.unlink()
    # An interrupted attempt with the same inputs leaves its partial work (e.g. training checkpoints)
    # for `work` to resume; partial work from other inputs is cleared first.
    pending_path = directory / "pending.json"
    pending = {"inputs": input_hashes, "config_hash": config_hash}
    if pending_path.exists() and read_json(pending_path) != pending:
        shutil.rmtree(directory)
        directory.mkdir(parents=True)
    write_json(pending, pending_path)
    started = time.time()
    with heap_frozen_during_stage():
        outputs, info = work(directory)
        seconds = time.time() - started
        # What the stage freed goes back to the machine before the next stage (tasks/memory.py).
        return_freed_memory()
    write_json(
        {
            "stage": name,
            "inputs": input_hashes,
            "config_hash": config_hash,
            "config": config,
            "outputs": {k: str(Path(v).relative_to(directory)) for k, v in outputs.items()},
            "output_hashes": {k: sha256_path(Path(v)) for k, v in outputs.items()},
            "started": datetime.fromtimestamp(started, UTC).isoformat(),
            "seconds": round(seconds, 3),
            "info": info,
        },
        manifest_path,
    )
    pending_path.unlink()
    return StageResult(name, directory, {k: Path(v) for k, v in outputs.items()}, False, seconds, info)
