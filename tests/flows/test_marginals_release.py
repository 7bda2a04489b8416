"""A release with measured marginals, end to end (the smoke profile measures them): the published epsilon
is the accountant's conversion of training's curve plus the marginals', the bundle's rows match the
measured (noisy) shares, the generator file carries the noisy counts and never the real ones, and a
resumed run measures the same."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.data.binning import frame_cells
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.generators import get
from dpsynth.models.generators.samplers import MARGINALS_KEY, load_sampler
from dpsynth.models.marginals.measure import MeasuredMarginals, marginal_counts
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.models.pyfunc import load_generator_file, sample_table
from dpsynth.tasks.marginals import measure_stage, released_parameters, training_values
from dpsynth.tasks.registry import load_released_model
from dpsynth.tasks.training import sample_generator_file
from tests.conftest import CARDIO_SCHEMA, publishing_smoke
from tests.flows.test_release_flow import _last_json
from tests.models.test_release_marginals import first_principles_epsilon


def release_with(generator: str, profile_arg: str, data, capfd) -> tuple[dict, object]:
    """`dpsynth release --generator G --json` on `data` with a profile path: (its summary, its run folder)."""
    argv = [
        "release",
        "--config",
        str(CARDIO_SCHEMA),
        "--data",
        str(data),
        "--profile",
        profile_arg,
        "--generator",
        generator,
        "--json",
    ]
    assert main(argv) == 0
    summary = _last_json(capfd)
    return summary, Path(summary["run_dir"]).resolve()


def _shares(frame: pd.DataFrame, schema, column: str, bins: int) -> np.ndarray:
    col = schema.column(column)
    cells = frame_cells([col], frame, bins)[:, 0]
    from dpsynth.models.data.binning import cell_count

    return np.bincount(cells[cells >= 0], minlength=cell_count(col, bins)) / len(frame)


@pytest.mark.parametrize("generator", ["gswgan", "dpcgan"])
def test_release_measures_composes_and_calibrates(
    isolated_workdir, demo_csv, cardio_schema, capfd, tmp_path, generator
):
    profile_arg = publishing_smoke(tmp_path / "profiles")
    summary, out = release_with(generator, profile_arg, demo_csv, capfd)
    profile = load_profile(profile_arg, CARDIO_SCHEMA).with_generator(generator)
    assert profile.marginals.enabled
    setting = profile.release_target()
    released = torch.load(out / "bundle" / "generator.pt", weights_only=True)
    measured = MeasuredMarginals.from_dict(released[MARGINALS_KEY]["measured"])

    # The epsilon: training's curve and the measurement's, added order by order and converted once.
    plan = get(generator).plan(profile, setting)
    composed = first_principles_epsilon(profile, setting, plan.last, measured.plan)
    ledger = json.loads((out / "train-k10" / "ledger.json").read_text())["checkpoints"]
    assert ledger[-1]["epsilon"] == pytest.approx(composed, rel=1e-6)
    assert summary["epsilon_training"] == pytest.approx(composed, rel=1e-6)
    assert summary["epsilon"] == max(plan.epsilon, profile.privacy.choice_epsilon)
    release = json.loads((out / "bundle" / "release.json").read_text())
    parameters = release["accountant"]["parameters"]
    assert parameters["marginals_rho"] == profile.marginals.rho
    assert parameters["marginals_selections"] == profile.marginals.selections
    assert "the measured marginals" in release["epsilon_covers"]

    counted = released_parameters(out / "bundle" / "generator.pt")
    assert counted["marginals_count"] == len(measured.marginals) == 2 * len(cardio_schema.column_names) - 1
    assert counted["marginals_noise_multiplier"] == measured.plan.noise_multipliers[0]

    # The bundle's rows: each column's shares are the measured ones (up to rounding to 2,000 rows).
    bundle_rows = pd.read_csv(out / "bundle" / "synthetic.csv", sep=cardio_schema.release_separator)
    assert len(bundle_rows) == profile.release_rows
    for column in cardio_schema.column_names:
        gap = 0.5 * np.abs(_shares(bundle_rows, cardio_schema, column, measured.bins) - measured.one_way(column)).sum()
        assert gap < 0.01, (column, gap)

    # The pyfunc model's sampling and the bundle's agree for a seed; the trainer's own checkpoint (no
    # marginals) samples the generator's rows as they are.
    encoder = TableEncoder(cardio_schema)
    registered = load_released_model(summary["model_uri"]).predict(pd.DataFrame({"n_rows": [300], "seed": [7]}))
    bundled = sample_generator_file(out / "bundle" / "generator.pt", cardio_schema, 300, 7)
    pd.testing.assert_frame_equal(registered, bundled)
    assert not bundled.equals(sample_table(load_generator_file(out / "bundle" / "generator.pt")[0], encoder, 300, 8))
    raw = json.loads((out / "train-k10" / "ledger.json").read_text())["checkpoints"][-1]
    trained = out / "train-k10" / "checkpoints" / raw["generator"]
    pd.testing.assert_frame_equal(
        sample_generator_file(trained, cardio_schema, 300, 7, raw["sha256"], generator),
        encoder.decode(load_sampler(trained, raw["sha256"], generator).sample(300, 7)),
    )

    # The selection scored what is released: its sample of the chosen checkpoint is the calibrated
    # sampling of the checkpoint file that carries the marginals.
    attached = json.loads((out / "marginals-k10" / "ledger.json").read_text())["checkpoints"]
    chosen = next(e for e in attached if e["iteration"] == summary["iteration"])
    scored = pd.read_parquet(out / "sample-k10" / f"synthetic_{chosen['iteration']:06d}.parquet")
    pd.testing.assert_frame_equal(
        scored,
        sample_generator_file(
            out / "marginals-k10" / "checkpoints" / chosen["generator"],
            cardio_schema,
            len(scored),
            profile.seed * 1_000_003 + chosen["iteration"],
            chosen["sha256"],
            generator,
        ),
    )

    # The file holds the noisy counts: they differ from the training rows' real counts by integer noise
    # of the declared scale, not by nothing.
    values = training_values(
        cardio_schema, pd.read_parquet(out / "validate" / "table.parquet"), np.load(out / "preprocess" / "gan_rows.npy")
    )
    residuals = np.concatenate(
        [
            np.asarray(m.noisy_counts) - marginal_counts(values, cardio_schema, m.columns, measured.bins)
            for m in measured.marginals
        ]
    )
    std = measured.marginals[0].noise_std
    assert np.all(residuals == np.rint(residuals)) and np.count_nonzero(residuals) > 0.9 * len(residuals)
    assert 0.8 * std < residuals.std() < 1.2 * std and abs(residuals.mean()) < 4 * std / math.sqrt(len(residuals))

    # A resumed run (the stage redone from its inputs with the run's secret) measures the same.
    stored = json.loads((out / "marginals" / "measured.json").read_text())
    assert stored == released[MARGINALS_KEY]["measured"]
    shutil.rmtree(out / "marginals")
    load_secret(out)  # the secret stays in the run folder
    again = measure_stage(
        out, cardio_schema, out / "validate" / "table.parquet", out / "preprocess" / "gan_rows.npy", profile
    )
    assert json.loads(again["marginals"].read_text()) == stored
