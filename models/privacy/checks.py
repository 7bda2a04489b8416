"""Number checks shared by the accountants and the measured marginals, in a module of their own so that
the pyfunc model's sampling path (models/marginals/measure.py through models/marginals/calibration.py) imports no
accountant (autodp, Opacus)."""

from __future__ import annotations

import math
import numbers
from typing import TypeGuard

from dpsynth.models.errors import ConfigError


def is_int(value: object) -> TypeGuard[numbers.Integral]:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> TypeGuard[numbers.Real]:
    """A finite real number that is not a bool (YAML's true would otherwise pass as 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def check_extra_rho(extra_rho: object) -> float:
    """The zCDP rho an accountant adds to its curve for another mechanism on the same rows (>= 0, finite)."""
    if not is_real(extra_rho) or float(extra_rho) < 0:
        raise ConfigError(f"the added zCDP rho must be a finite number >= 0, got {extra_rho!r}")
    return float(extra_rho)
