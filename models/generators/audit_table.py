"""The calibration audit table (`bench/audit.py --mode calibration`): every registered generator's audits
(its package's audit.py, named by its registration's `audits`), in registration order, then the
measured marginals' (models/marginals/audit.py), so that a generator brings its audits with it and
models/privacy imports no generator for them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dpsynth.models.generator_registry import registrations
from dpsynth.models.marginals.audit import CALIBRATION_AUDITS as MARGINALS_AUDITS


def calibration_audit_table() -> dict[str, Callable[..., dict]]:
    """Every calibration audit by name, each called as audit(trials=..., halve_noise=..., seed=...)."""
    table: dict[str, Callable[..., dict]] = {}
    for name, audits in [(r.name, r.calibration_audits()) for r in registrations()] + [("marginals", MARGINALS_AUDITS)]:
        for mechanism, audit in audits.items():
            if mechanism in table:
                raise ValueError(f"{name!r} registers the calibration audit {mechanism!r} again")
            table[mechanism] = audit
    return table


def calibration_audits(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    mechanisms: Sequence[str] | None = None,
    seed: int = 0,
) -> list[dict]:
    """The calibration audit of each mechanism in `mechanisms` (default: the whole table), `trials` per
    input, one intra-op thread."""
    table = calibration_audit_table()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [table[name](trials=trials, halve_noise=halve_noise, seed=seed) for name in mechanisms or table]
    finally:
        torch.set_num_threads(before)
