"""The import contracts (.importlinter, docs/extending.md "Layers") are a gate that fails: the gate script
CI runs (.ci/importlint) passes on a scratch copy of the tree, and fails on the same copy once one module
imports from a layer above its own, even under TYPE_CHECKING."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a plain install of the tree reads (setup.py, pyproject.toml), the contract and the gate script.
COPIED = ("dpsynth", "models", "tasks", "flows", "configs", "setup.py", "pyproject.toml", "README.md", ".ci")
UPWARD = """
import typing

if typing.TYPE_CHECKING:  # an upward import: privacy sits below the generators
    from dpsynth.models.generators.base import GeneratorType  # noqa: F401
"""


def _gate(tree: Path) -> subprocess.CompletedProcess:
    # The venv's pip and lint-imports first on PATH, as in CI after `pip install -e ".[dev]"`.
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run([str(tree / ".ci" / "importlint")], cwd=tree, env=env, capture_output=True, text=True)


@pytest.mark.slow  # two plain installs of the tree (about ten seconds each on 2 cores)
def test_the_import_gate_fails_on_an_upward_import(tmp_path):
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in COPIED:
        source = ROOT / name
        (shutil.copytree(source, tree / name, ignore=ignore) if source.is_dir() else shutil.copy2(source, tree / name))
    shutil.copy2(ROOT / ".importlinter", tree / ".importlinter")

    kept = _gate(tree)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "Contracts: 3 kept, 0 broken." in kept.stdout

    with (tree / "models" / "privacy" / "budget.py").open("a") as module:
        module.write(UPWARD)
    broken = _gate(tree)
    assert broken.returncode != 0
    assert "dpsynth.models.privacy is not allowed to import dpsynth.models.generators" in broken.stdout
    assert "dpsynth.models.privacy.budget -> dpsynth.models.generators.base" in broken.stdout
