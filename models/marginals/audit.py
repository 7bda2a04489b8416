"""The measured marginals' calibration audit (`bench/audit.py --mode calibration`; the statistics are
models/privacy/audit.py's): one noisy marginal on a canary pair. Not a generator's: the audit table
(models/generators/audit_table.py) lists it after the generators' own."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from dpsynth.models.privacy.audit import (
    audit_secret,
    calibration_result,
    gaussian_epsilon,
    noise_run,
)


def measured_marginal_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 1.07,
    rows: int = 50,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """The measured marginals' query (models/marginals/measure.py `noisy_marginal`, what `measure` runs for each
    marginal), called once per trial on a three-level column: `rows` - 1 public rows and a canary in the
    first level on the first input, in the last level on the neighbour (a replacement: one count down,
    another up). Score: the output's projection on c(x) - c(x'). Exact: the Gaussian mechanism with
    sensitivity sqrt(2) and noise sigma sqrt(2) (mu = 1 / sigma); the claim, the plan's replace-one epsilon
    of one marginal."""
    import pandas as pd

    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.models.marginals.measure import MeasurementPlan, frame_codes, noisy_marginal

    started = time.perf_counter()
    schema = DatasetSchema.from_dict(
        {
            "name": "audit",
            "target": "y",
            "columns": {
                "x": {"type": "categorical", "levels": ["a", "b", "c"]},
                "y": {"type": "binary", "levels": [0, 1]},
            },
        }
    )
    background = list(np.random.default_rng(seed).choice(["a", "b", "c"], rows - 1))
    diff = np.array([1.0, 0.0, -1.0])  # c(x) - c(x'): the canary moved from "a" to "c"
    sigma = noise_run(noise_multiplier, halve_noise)
    scores = {}
    for first in (True, False):
        frame = pd.DataFrame({"x": background + ["a" if first else "c"], "y": 0})
        codes = frame_codes(schema, frame, ["x"])
        noise = audit_secret(seed, "marginals", first, halve_noise).numpy("marginals")
        out = np.empty((trials, 3))
        for t in range(trials):
            out[t] = noisy_marginal(codes, schema, ("x",), sigma, 20, noise)
        scores[first] = out @ diff
    exact = gaussian_epsilon(1.0 / noise_multiplier, delta)
    claimed = MeasurementPlan((("x",),), (noise_multiplier,)).epsilon(delta)
    return calibration_result(
        "measured-marginals",
        scores[True],
        scores[False],
        exact,
        claimed,
        delta,
        noise_multiplier,
        halve_noise,
        required,
        started,
        function="dpsynth.models.marginals.measure.noisy_marginal",
        rows=rows,
        exact_of="the Gaussian mechanism, mu = sqrt(2) / (sigma sqrt(2)) = 1 / sigma",
    )


# Each called as audit(trials=..., halve_noise=..., seed=...), its other parameters left at their defaults;
# listed in the audit table by models/generators/audit_table.py.
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "measured-marginals": measured_marginal_audit,
}
