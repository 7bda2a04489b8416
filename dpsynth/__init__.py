"""dpsynth: differentially private synthetic copies of sensitive tables.

The analyst's API (docs/api.md), imported on first use so that `import dpsynth` stays light (no torch,
Prefect or MLflow until a name below is used):

    dpsynth.Schema      a table's public schema: `Schema.from_yaml(path)`, or `Schema.draft(df)` to fill in
    dpsynth.release     train, evaluate and release (or try, `publish=False`) a generator for a table
    dpsynth.Release     what `release` returns: epsilon, delta, statement, bundle, model URI, quality
    dpsynth.load        a released generator (bundle folder, generator file or models:/ URI) as a Sampler
    dpsynth.Sampler     `.sample(n, seed=None, conditions=None)`: decoded synthetic rows

The installed package also holds the pipeline's three layers as `dpsynth.models` (generators, privacy
accounting, evaluation: no Prefect or MLflow), `dpsynth.tasks` (one module per stage) and
`dpsynth.flows` (the Prefect flows and the `dpsynth` command line). The repository keeps them as the
top-level folders `models/`, `tasks/` and `flows/`; `setup.py` maps them under this package.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dpsynth")
except PackageNotFoundError:  # a copy of the code without its metadata (e.g. a registered model's code)
    __version__ = "unknown"

# Public name -> the module under dpsynth/api/ that defines it.
_API = {
    "Schema": "dpsynth.api.schema",
    "release": "dpsynth.api.release",
    "Release": "dpsynth.api.release",
    "Quality": "dpsynth.api.release",
    "load": "dpsynth.api.load",
    "Sampler": "dpsynth.api.load",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    """The API's names, imported when first used (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'dpsynth' has no attribute {name!r}")
    value = getattr(import_module(_API[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
