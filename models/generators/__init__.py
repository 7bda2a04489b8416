"""The DP generators behind one interface (models/generators/base.py), keyed by the profile's
`generator` (or a setting's own; `--generator` overrides both).

This module stays import-light (the pyfunc model imports `dpsynth.models.generators.samplers` through it):
a generator's module is imported only when it is asked for. A fourth generator is one module here
with a `GeneratorType` subclass, one line in `_MODULES`, its name in `dpsynth.models.config.GENERATORS` and
its own profile section.
"""

from __future__ import annotations

import importlib

from dpsynth.models.config import GENERATORS, Profile, Setting

# name -> (module, class)
_MODULES = {
    "gswgan": ("dpsynth.models.generators.gswgan.adapter", "GSWGAN"),
    "dpcgan": ("dpsynth.models.generators.dpcgan.adapter", "DPCGAN"),
    "dpautogan": ("dpsynth.models.generators.dpautogan.adapter", "DPAutoGAN"),
}
_LOADED: dict = {}


def get(name: str):
    """The generator type registered under `name`."""
    if name not in _MODULES:
        from dpsynth.models.errors import ConfigError

        raise ConfigError(f"Unknown generator {name!r}: choose one of {', '.join(GENERATORS)}.")
    if name not in _LOADED:
        module, cls = _MODULES[name]
        _LOADED[name] = getattr(importlib.import_module(module), cls)()
    return _LOADED[name]


def generator_for(profile: Profile, setting: Setting):
    """The generator type that trains `setting` under `profile`."""
    return get(profile.generator_of(setting))


assert set(_MODULES) == set(GENERATORS), "every generator a profile may name is registered"
