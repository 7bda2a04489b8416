"""The profiles a schema can name: the `*.yaml` files of `profiles/` beside it (models/config.py
`profile_path`), listed for `dpsynth profiles` and for the error a misspelt profile name gets."""

from __future__ import annotations

from pathlib import Path

from dpsynth.models.config import Profile, load_profile, profile_path
from dpsynth.models.errors import ConfigError


def profiles_folder(config_path: str | Path | None) -> Path:
    """The folder a profile name resolves in, for this schema."""
    return profile_path("_", config_path).parent


def known_profiles(config_path: str | Path | None) -> list[str]:
    """The names of the profiles beside the schema, sorted."""
    folder = profiles_folder(config_path)
    return sorted(path.stem for path in folder.glob("*.yaml")) if folder.is_dir() else []


def load_named(profile: str, config_path: str | Path | None) -> Profile:
    """`load_profile`, with an unknown profile name refused by a message that lists the known ones."""
    path = profile_path(profile, config_path)
    if Path(profile).suffix in (".yaml", ".yml") or path.is_file():  # a path: load_profile says if it is missing
        return load_profile(profile, config_path)
    known = known_profiles(config_path)
    listed = ", ".join(known) if known else "none"
    raise ConfigError(
        f"Profile {profile!r} does not exist: there is no {str(path)!r}. Profiles beside the "
        f"schema: {listed} (`dpsynth profiles` describes them); a profile may also be given as "
        "the path of a YAML file."
    )
