"""The profiles a schema can name: its own, the `*.yaml` files of `profiles/` beside it, and the ones
shipped inside the package (models/config.py `profile_path`: beside the schema first), listed for
`dpsynth profiles` and for the error a misspelt profile name gets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpsynth.models.config import Profile, load_profile, profile_path, shipped_profiles_folder
from dpsynth.models.errors import ConfigError


@dataclass(frozen=True)
class ProfileFile:
    """A profile a name resolves to: `shipped` with the package, or the schema's own (beside it)."""

    name: str
    path: Path
    shipped: bool


def profiles_folder(config_path: str | Path | None) -> Path:
    """The folder of the schema's own profiles (a name is looked up there first)."""
    return profile_path("_", config_path).parent


def _names(folder: Path) -> list[str]:
    return sorted(path.stem for path in folder.glob("*.yaml")) if folder.is_dir() else []


def known_profiles(config_path: str | Path | None) -> list[str]:
    """The names of the profiles beside the schema, sorted."""
    return _names(profiles_folder(config_path))


def shipped_profiles() -> list[str]:
    """The names of the profiles shipped inside the package, sorted."""
    return _names(shipped_profiles_folder())


def profile_files(config_path: str | Path | None) -> list[ProfileFile]:
    """Every profile a name can resolve to for this schema: its own first, then the shipped ones that none
    of its own hides (a profile beside the schema wins over a shipped one of the same name). Without a
    schema, the shipped ones only."""
    shipped_folder = shipped_profiles_folder()
    own_folder = profiles_folder(config_path).resolve() if config_path else None
    own = [] if own_folder is None or own_folder == shipped_folder else known_profiles(config_path)
    files = [ProfileFile(name, own_folder / f"{name}.yaml", False) for name in own if own_folder]
    shipped = [name for name in shipped_profiles() if name not in own]
    files += [ProfileFile(name, shipped_folder / f"{name}.yaml", True) for name in shipped]
    return files


def load_named(profile: str, config_path: str | Path | None) -> Profile:
    """`load_profile`, with an unknown profile name refused by a message that lists the known ones."""
    path = profile_path(profile, config_path)
    if Path(profile).suffix in (".yaml", ".yml") or path.is_file():  # a path: load_profile says if it is missing
        return load_profile(profile, config_path)
    own = known_profiles(config_path) if profiles_folder(config_path).resolve() != shipped_profiles_folder() else []
    where = f"beside the schema ({str(path.parent)!r}): {', '.join(own)}; " if own else ""
    raise ConfigError(
        f"Profile {profile!r} does not exist: not beside the schema ({str(path)!r}) and not among the "
        f"profiles shipped with dpsynth. Profiles {where}shipped with dpsynth: {', '.join(shipped_profiles())} "
        "(`dpsynth profiles` describes them); a profile may also be given as the path of a YAML file."
    )
