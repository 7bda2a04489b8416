"""Number checks shared by the accountants and the measured marginals, in a module of their own so that
the pyfunc model's sampling path (models/marginals.py through models/calibration.py) imports no
accountant (autodp, Opacus)."""

from __future__ import annotations

import math
import numbers


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite real number that is not a bool (YAML's true would otherwise pass as 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
