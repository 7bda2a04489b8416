"""A generator shipped as its own distribution registers with no edit to dpsynth: a toy DP generator,
written here as ONE package (with the `.dist-info` that declares it in the entry-point group
`dpsynth.generators`) in a temporary folder on sys.path, passes the generator conformance checks, is a
`--generator` choice, and `dpsynth release --generator toy` publishes it, its labelled parameters in
release.json, the release notes and the report.

The toy is a correct DP generator, not a fake: each encoded column's histogram over its public cells
(dpsynth.models.data.binning) is released once by the Gaussian mechanism (replace-one L2 sensitivity
sqrt(2) per histogram, so a histogram at noise sigma costs zCDP 1 / sigma^2 and the profile's `toy.rho`
fixes sigma from the public schema), accounted with the measured marginals as zCDP (RDP order x rho)
and converted by the project's accountant; rows are drawn column by column from the noisy histograms.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest

from dpsynth.flows.cli import build_parser, main
from dpsynth.generator_checks import CHECKS, smoke_profile, train_for_checks
from dpsynth.models.config import load_profile
from dpsynth.models.generators import names, refresh
from tests.conftest import CARDIO_SCHEMA, publishing_smoke
from tests.flows.test_release_flow import _last_json

PACKAGE = "toy_dpsynth"

TOY_PACKAGE = {
    "__init__.py": '''
        """A toy DP generator: independent columns, each a noisy histogram over its public cells."""

        from dpsynth.models.generator_registry import Registration

        GENERATOR = Registration(name="toy", section="toy", config="toy_dpsynth.config:ToyConfig",
                                 adapter="toy_dpsynth.adapter:Toy", sampler="toy_dpsynth.sampler:ToySampler")
    ''',
    "config.py": '''
        """The profile section `toy`."""

        from typing import Annotated

        from pydantic import Field, Strict

        from dpsynth.models.config_validation import Positive
        from dpsynth.models.generator_section import SectionConfig


        class ToyConfig(SectionConfig):
            smoke = {"bins": 10}   # its section in a smoke-sized profile (and the checks): coarser bins
            rho: Positive = 0.5   # the histograms' zCDP, all columns together (replace-one)
            bins: Annotated[int, Strict(), Field(ge=1, le=1000)] = 20   # cells of a continuous column
    ''',
    "adapter.py": '''
        """The toy behind the generator interface: checkpoint 0 is uniform histograms (no row read),
        checkpoint 1 the released noisy ones."""

        import math
        import time

        import numpy as np
        import pandas as pd
        import torch

        from dpsynth.models.checkpoint_files import save_verified
        from dpsynth.models.data.binning import cell_codes, cell_count, cell_values
        from dpsynth.models.data.encoding import TableEncoder
        from dpsynth.models.generators.base import (ADJACENCY, NO_DONORS, FitResult, GeneratorType, PrivacyFacts,
                                                    Schedule, require_private)
        from dpsynth.models.marginals.release import REPLACE_ONE, marginals_rho
        from dpsynth.models.privacy.accountant import epsilon_for

        LABELS = {"toy_rho": "toy histograms' zCDP rho", "toy_bins": "toy bins per continuous column"}


        def replace_one_epsilon(profile, rho: float) -> float:
            # No iterative queries: the accountant's classic conversion of the zCDP curve alpha x rho alone.
            return epsilon_for(1, 0, 1, 1.0, profile.privacy.delta, extra_rho=rho)


        def noise_multiplier(columns: int, rho: float) -> float:
            # Each histogram at sigma (sensitivity sqrt(2)) costs 2 / (2 sigma^2): `columns` of them cost rho.
            return math.sqrt(columns / rho)


        class Toy(GeneratorType):
            name = "toy"
            label = "Toy histograms"

            def check(self, profile, setting, schema=None):
                require_private(self, setting)

            def schedule(self, profile, setting):
                measured = marginals_rho(profile, REPLACE_ONE)
                epsilons = (replace_one_epsilon(profile, measured),
                            replace_one_epsilon(profile, measured + profile.toy.rho))
                return Schedule((0, 1), epsilons, 1, "lower toy.rho")

            def checkpoint_interval(self, profile):
                return 1

            def fit(self, job, prepared, plan, progress=None):
                start = time.perf_counter()
                config, encoder = job.profile.toy, TableEncoder(job.schema)
                blocks = [(b.start, b.stop, b.column) for b in encoder.blocks]
                cells = [cell_count(column, config.bins) for _, _, column in blocks]
                histograms = [np.full(n, 1.0 / n) for n in cells]   # checkpoint 0: no row read
                released = {0: histograms}
                if plan.last >= 1:
                    frame = encoder.decode(job.data)
                    sigma = noise_multiplier(len(blocks), config.rho)
                    noise = job.secret.numpy("toy-noise")
                    noisy = []
                    for (_, _, column), n in zip(blocks, cells):
                        codes = cell_codes(column, frame[column.name], config.bins)
                        counts = np.bincount(codes[codes >= 0], minlength=n).astype(np.float64)
                        kept = np.clip(counts + noise.normal(0.0, sigma, n), 0.0, None)
                        noisy.append(kept / kept.sum() if kept.sum() > 0 else np.full(n, 1.0 / n))
                    released[1] = noisy
                representatives = self._representatives(encoder, blocks, cells, config.bins)
                directory = job.directory / "checkpoints"
                directory.mkdir(parents=True, exist_ok=True)
                ledger = []
                for iteration, epsilon in zip(plan.iterations, plan.epsilons):
                    path = directory / f"toy_{iteration:06d}.pt"
                    digest = save_verified({"blocks": [[a, b] for a, b, _ in blocks], "width": encoder.width,
                                            "representatives": representatives,
                                            "probabilities": [torch.from_numpy(p) for p in released[iteration]],
                                            "iteration": iteration, "epsilon": epsilon,
                                            "delta": job.profile.privacy.delta}, path)
                    ledger.append({"iteration": iteration, "epsilon": epsilon, "generator": path.name,
                                   "sha256": digest})
                    if progress is not None:
                        progress(iteration, f"epsilon {epsilon:.3f}")
                return FitResult(ledger, time.perf_counter() - start)

            @staticmethod
            def _representatives(encoder, blocks, cells, bins):
                """Each cell's encoded value: its level, point mass, or a value of its bin (public facts only)."""
                rng = np.random.default_rng(0)
                longest = max(cells)
                frame = pd.DataFrame({column.name: cell_values(column, np.arange(longest) % n, rng, bins)
                                      for (_, _, column), n in zip(blocks, cells)})
                encoded = encoder.encode(frame[encoder.schema.column_names]).astype(np.float32)
                return [torch.from_numpy(encoded[:n, a:b].copy()) for (a, b, _), n in zip(blocks, cells)]

            def training_facts(self, profile, setting):
                c = profile.toy
                return PrivacyFacts(
                    generator=self.label,
                    mechanism=("the Gaussian mechanism on each encoded column's histogram over its public cells, "
                               "released once"),
                    accountant="zCDP: rho = columns / sigma^2 (RDP order x rho)",
                    conversion="classic: epsilon = min over orders a of RDP(a) + log(1/delta)/(a - 1)",
                    sampling="every training row counts once in every column's histogram",
                    adjacency=f"{ADJACENCY} (L2 sensitivity sqrt(2) per histogram)",
                    sanitised=("each histogram's counts get Gaussian noise from a secret drawn for the run; rows are "
                               "drawn from the noisy histograms only"),
                    imputation=NO_DONORS,
                    parameters={"toy_rho": c.rho, "toy_bins": c.bins},
                    labels=LABELS)
    ''',
    "sampler.py": '''
        """Rows drawn column by column from a toy file's histograms (numpy and torch only)."""

        import numpy as np


        class ToySampler:
            def __init__(self, blob):
                self.blocks = [tuple(int(x) for x in block) for block in blob["blocks"]]
                self.representatives = [r.numpy() for r in blob["representatives"]]
                self.probabilities = [p.numpy() for p in blob["probabilities"]]
                self.width = int(blob["width"])

            def sample(self, n_rows, seed):
                rng = np.random.default_rng(int(seed))
                rows = np.zeros((n_rows, self.width), dtype=np.float32)
                for (start, stop), cells, probabilities in zip(self.blocks, self.representatives, self.probabilities):
                    rows[:, start:stop] = cells[rng.choice(len(probabilities), size=n_rows, p=probabilities)]
                return rows
    ''',
}


@pytest.fixture
def toy_generator(tmp_path, monkeypatch):
    """The toy package and its `.dist-info` on sys.path (and PYTHONPATH, for any worker process) while
    the test runs; the registry searched again before and after."""
    site = tmp_path / "site"
    (site / PACKAGE).mkdir(parents=True)
    for name, text in TOY_PACKAGE.items():
        (site / PACKAGE / name).write_text(textwrap.dedent(text).lstrip())
    info = site / "toy_dpsynth-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-dpsynth\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[dpsynth.generators]\ntoy = {PACKAGE}\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    sys.path.insert(0, str(site))
    refresh()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[module]
        importlib.invalidate_caches()
        refresh()


def test_the_toy_is_registered_by_its_entry_point_only(toy_generator):
    assert "toy" in names() and {"gswgan", "dpcgan", "dpautogan"} <= set(names())
    parsed = build_parser().parse_args(["release", "--config", "c.yaml", "--data", "d.csv", "--generator", "toy"])
    assert parsed.generator == "toy"


def test_the_toy_is_smoke_sized_and_compared_by_its_package_alone(toy_generator):
    # Its smoke sizing is its config's (`smoke`), and `compare` sets it at epsilon 1 and 3 beside the
    # others: no profile names it.
    assert load_profile("smoke", CARDIO_SCHEMA).toy.bins == 10 and load_profile("default", CARDIO_SCHEMA).toy.bins == 20
    compare = load_profile("compare", CARDIO_SCHEMA)
    toy = {s.name: s.epsilon_budget for s in compare.settings if compare.generator_of(s) == "toy"}
    assert toy == {"toy-eps1": 1.0, "toy-eps3": 3.0}


def test_without_its_distribution_the_toy_is_gone():
    assert "toy" not in names()


def test_the_toy_passes_the_generator_conformance_checks(toy_generator, tmp_path, cardio_schema):
    profile, setting = smoke_profile("toy", CARDIO_SCHEMA)
    trained = train_for_checks("toy", profile, setting, cardio_schema, tmp_path / "checks")
    for check in CHECKS:
        check(trained)


def test_release_with_the_toy_publishes_its_labelled_parameters(
    toy_generator, isolated_workdir, demo_csv, capfd, tmp_path
):
    # The release's setting alone (no GS-WGAN baseline beside it): the report describes the toy's mechanism.
    profile = publishing_smoke(tmp_path / "profiles", settings=[{"name": "k10", "discriminators": 10}])
    assert (
        main(
            [
                "release",
                "--config",
                str(CARDIO_SCHEMA),
                "--data",
                str(demo_csv),
                "--profile",
                profile,
                "--generator",
                "toy",
                "--json",
            ]
        )
        == 0
    )
    summary = _last_json(capfd)
    out = isolated_workdir / summary["run_dir"]
    assert summary["model_uri"] == "models:/cardio-toy/1"
    release = json.loads((out / "bundle" / "release.json").read_text())
    assert release["accountant"]["parameters"]["generator"] == "Toy histograms"
    assert (
        release["accountant"]["parameters"]["toy_rho"] == 0.5 and release["accountant"]["parameters"]["toy_bins"] == 10
    )
    # The notes show each parameter under the toy's label; the internal report under its key.
    notes = (out / "bundle" / "RELEASE_NOTES.md").read_text()
    assert "toy histograms' zCDP rho" in notes and "toy bins per continuous column" in notes
    report = (out / "report" / "report.html").read_text()
    assert "toy_rho" in report and "toy_bins" in report
