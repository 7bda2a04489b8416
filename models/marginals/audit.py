"""The measured marginals' calibration audit (`bench/audit.py --mode calibration`; the statistics are
models/privacy/audit.py's): one noisy marginal on a canary pair. Not a generator's: the audit table
(models/generators/audit_table.py) lists it after the generators' own."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from dpsynth.models.privacy.audit import Calibration, gaussian_epsilon


def measured_marginal_audit(trials: int = 1_000_000, halve_noise: bool = False, seed: int = 0, rows: int = 50) -> dict:
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
    audit = Calibration(trials, halve_noise, seed, noise_multiplier=1.07)
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

    def scores(first: bool) -> np.ndarray:
        frame = pd.DataFrame({"x": background + ["a" if first else "c"], "y": 0})
        codes = frame_codes(schema, frame, ["x"])
        noise = audit.secret("marginals", first).numpy("marginals")
        out = np.empty((trials, 3))
        for t in range(trials):
            out[t] = noisy_marginal(codes, schema, ("x",), audit.sigma, 20, noise)
        return out @ diff

    return audit.result(
        "measured-marginals",
        scores,
        gaussian_epsilon(1.0 / audit.noise_multiplier, audit.delta),
        MeasurementPlan((("x",),), (audit.noise_multiplier,)).epsilon(audit.delta),
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
