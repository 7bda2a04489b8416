"""The calibration audit table (`bench/audit.py --mode calibration`): the shared sanitisers' audits
(models/privacy/audit.py) and then every registered generator's own (its package's audit.py, named by its
registration's `audits`), so that a generator brings its audits with it and models/privacy imports no
generator for them."""

from __future__ import annotations

from collections.abc import Callable

from dpsynth.models.generator_registry import registrations
from dpsynth.models.privacy.audit import CALIBRATION_AUDITS


def calibration_audit_table() -> dict[str, Callable[..., dict]]:
    """Every calibration audit by name, each called as audit(trials=..., halve_noise=..., seed=...)."""
    table = dict(CALIBRATION_AUDITS)
    for registration in registrations():
        for name, audit in registration.calibration_audits().items():
            if name in table:
                raise ValueError(f"generator {registration.name!r} registers the calibration audit {name!r} again")
            table[name] = audit
    return table
