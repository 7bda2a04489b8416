"""The one list of generators: every package that registers one, found rather than listed.

A generator is a package that holds a `GENERATOR = Registration(...)` in its `__init__.py`: its name (the
profile's `generator`, `--generator`), its profile section's key, and where its config model, adapter and
sampler live ("module:attribute", imported on first use). Two places are searched:

* the subpackages of `dpsynth.models.generators` (the built-in generators);
* the entry-point group `dpsynth.generators`, whose entries name such a package (or its registration),
  so that a generator shipped as its own distribution registers without an edit to dpsynth.

Listing names imports only those `__init__.py` files (no pydantic, torch or Opacus): the command line
builds its `--generator` choices from it at startup. `refresh()` forgets what was found (a distribution
installed or removed while the process runs).

It is configuration, under the generators' layer (docs/extending.md, "Layers"): the profile reads the list
and each section's model from here, and the generators are found by name (importlib, entry points), never
imported by this module, so that nothing here depends on a generator's code.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from dpsynth.models.errors import ConfigError

if TYPE_CHECKING:
    from dpsynth.models.generator_section import SectionConfig

ENTRY_POINT_GROUP = "dpsynth.generators"
BUILT_IN_PACKAGE = "dpsynth.models.generators"
# The generator of a profile that names none (the thesis' GS-WGAN).
DEFAULT_GENERATOR = "gswgan"


def _resolve(reference: str) -> Any:
    """The object a "module:attribute" reference names."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Registration:
    """What dpsynth knows of a generator before importing any of its heavy code."""

    name: str  # the profile's `generator` value
    section: str  # its profile section's key (GS-WGAN's is "gan")
    config: str  # "module:Class" of its section's pydantic model (models/generator_section.py)
    adapter: str  # "module:Class" of its GeneratorType (models/generators/base.py)
    sampler: str  # "module:Class" of its Sampler: built from a generator file's contents (`blob`)
    # "module:attribute" of its calibration audits, {name: audit(trials=, halve_noise=, seed=)} (its
    # package's audit.py; models/generators/audit_table.py lists them), or None
    audits: str | None = None
    _loaded: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @classmethod
    def in_package(
        cls, package: str, name: str, config: str, adapter: str, sampler: str, section: str | None = None
    ) -> Registration:
        """The usual layout of a generator `package` (its `__name__`): the classes `config`, `adapter` and
        `sampler` in its config.py, adapter.py and sampler.py, its audits in audit.py's
        CALIBRATION_AUDITS, its section named after it unless `section` says otherwise."""
        return cls(
            name,
            name if section is None else section,
            f"{package}.config:{config}",
            f"{package}.adapter:{adapter}",
            f"{package}.sampler:{sampler}",
            f"{package}.audit:CALIBRATION_AUDITS",
        )

    def config_model(self) -> type[SectionConfig]:
        """The pydantic model of its profile section."""
        return self._load("config", self.config)

    # The adapter and the sampler are typed by the layer that uses them (dpsynth.models.generators `get` and
    # samplers.py): this module sits under the generators (it is what the profile reads, docs/extending.md,
    # "Layers") and names none of their types.
    def adapter_instance(self) -> Any:
        """Its GeneratorType (imports its adapter module, not yet its trainer)."""
        if "instance" not in self._loaded:
            self._loaded["instance"] = self._load("adapter", self.adapter)()
        return self._loaded["instance"]

    def sampler_class(self) -> Any:
        """Its Sampler class, built from a generator file's contents (`blob`)."""
        return self._load("sampler", self.sampler)

    def calibration_audits(self) -> dict[str, Callable[..., dict]]:
        """Its calibration audits by name (none when it registers none)."""
        return {} if self.audits is None else dict(self._load("audits", self.audits))

    def _load(self, what: str, reference: str) -> Any:
        if what not in self._loaded:
            self._loaded[what] = _resolve(reference)
        return self._loaded[what]


def _registration_in(found: object, origin: str) -> Registration:
    """A package's `GENERATOR`, or a Registration named directly by an entry point."""
    registration = getattr(found, "GENERATOR", found)
    if not isinstance(registration, Registration):
        raise TypeError(f"{origin} is not a dpsynth generator: it holds no `GENERATOR = Registration(...)`")
    return registration


@functools.cache
def registrations() -> tuple[Registration, ...]:
    """Every registered generator: the built-in ones in package order, then the entry points' by name."""
    found: dict[str, Registration] = {}
    package = importlib.import_module(BUILT_IN_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.ispkg:
            continue
        registration = getattr(importlib.import_module(f"{BUILT_IN_PACKAGE}.{module.name}"), "GENERATOR", None)
        if isinstance(registration, Registration):
            found[registration.name] = registration
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        registration = _registration_in(entry.load(), f"entry point {entry.name!r} ({entry.value})")
        if registration.name in found:
            raise ValueError(f"entry point {entry.name!r} registers the generator {registration.name!r} again")
        found[registration.name] = registration
    sections = [r.section for r in found.values()]
    repeated = sorted({s for s in sections if sections.count(s) > 1})
    if repeated:
        raise ValueError(f"generators share a profile section: {', '.join(repeated)}")
    return tuple(found.values())


def names() -> tuple[str, ...]:
    return tuple(r.name for r in registrations())


def registration(name: str) -> Registration:
    """The registration of `name`; ConfigError for a name nothing registers."""
    for found in registrations():
        if found.name == name:
            return found
    raise ConfigError(f"Unknown generator {name!r}: choose one of {', '.join(names())}.")


def refresh() -> None:
    """Forget the generators found so far: the next look-up searches again (after a distribution that
    declares one was installed or removed in this process)."""
    importlib.invalidate_caches()
    registrations.cache_clear()
