"""The DP generators behind one interface (models/generators/base.py), keyed by the profile's
`generator` (or a setting's own; `--generator` overrides both).

Each generator is one package that registers itself (models/generator_registry.py): the built-in ones
here (`gswgan/`, `dpcgan/`, `dpautogan/`), others through the entry-point group `dpsynth.generators`.
This module stays import-light (the pyfunc model reaches the samplers through it): a generator's
adapter, trainer and sampler are imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpsynth.models.generator_registry import names, refresh, registration, registrations

if TYPE_CHECKING:
    from dpsynth.models.config import Profile, Setting
    from dpsynth.models.generators.base import GeneratorType

__all__ = ["generator_for", "get", "names", "refresh", "registration", "registrations"]


def get(name: str) -> GeneratorType:
    """The generator type registered under `name` (ConfigError for an unknown name)."""
    return registration(name).adapter_instance()


def generator_for(profile: Profile, setting: Setting) -> GeneratorType:
    """The generator type that trains `setting` under `profile`."""
    return get(profile.generator_of(setting))
