"""The repository keeps `models/`, `tasks/` and `flows/` at its top level; the wheel installs them as
`dpsynth.models`, `dpsynth.tasks` and `dpsynth.flows` (no top-level `models` in site-packages), and the
schemas and profiles of `configs/` as `dpsynth.configs`. Every other setting is in pyproject.toml."""

from setuptools import find_packages, setup

LAYERS = ("models", "tasks", "flows")

setup(
    packages=["dpsynth", "dpsynth.api", "dpsynth.configs"]
    + [f"dpsynth.{name}" for name in find_packages(include=[f"{layer}*" for layer in LAYERS])],
    package_dir={"dpsynth": "dpsynth", "dpsynth.configs": "configs", **{f"dpsynth.{layer}": layer for layer in LAYERS}},
)
