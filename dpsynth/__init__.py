"""dpsynth: differentially private synthetic copies of sensitive tables.

The installed package holds the pipeline's three layers as `dpsynth.models` (generators, privacy
accounting, evaluation: no Prefect or MLflow), `dpsynth.tasks` (one module per stage) and
`dpsynth.flows` (the Prefect flows and the `dpsynth` command line). The repository keeps them as the
top-level folders `models/`, `tasks/` and `flows/`; `setup.py` maps them under this package.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dpsynth")
except PackageNotFoundError:  # a copy of the code without its metadata (e.g. a registered model's code)
    __version__ = "unknown"
