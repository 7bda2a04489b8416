"""What a run needs to know before any stage starts: schema, profile, data hash, ids and folders.

Loaded and checked once, at the edge (the command line or the flow's first step).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from models.config import Profile, load_profile
from models.errors import MissingInputError
from models.schema import DatasetSchema
from tasks.stage import sha256_file, sha256_json


@dataclass(frozen=True)
class RunContext:
    schema_path: Path
    data_path: Path
    schema: DatasetSchema
    profile: Profile
    data_hash: str
    run_id: str
    run_dir: Path

    @property
    def model_name(self) -> str:
        return self.profile.model_name or f"{self.schema.name}-gswgan"


def load_context(config: str, data: str, profile: str, out: str | None, kind: str) -> RunContext:
    schema = DatasetSchema.from_yaml(config)
    prof = load_profile(profile, config)
    data_path = Path(data)
    if not data_path.is_file():
        raise MissingInputError(f"The data file {data!r} does not exist (or is not a file).")
    data_hash = sha256_file(data_path)
    # Same table, schema and profile -> same id and folder: a rerun resumes and skips finished stages.
    config_hash = sha256_json([prof.config_hash, schema.source_hash])
    run_id = f"{schema.name}-{prof.name}-{data_hash[:8]}-{config_hash[:8]}"
    run_dir = Path(out) if out else Path("runs") / kind / run_id
    return RunContext(Path(config), data_path, schema, prof, data_hash, run_id, run_dir)
