"""A spy on AIM's privacy ledger, shared by the AIM tests that check what a fit spends."""

from __future__ import annotations

import pytest

from dpsynth.models.generators.aim import mechanism
from dpsynth.models.generators.aim.privacy import RhoLedger


def keep_ledgers(patch: pytest.MonkeyPatch) -> list[RhoLedger]:
    """Patch AIM's ledger class (inside `patch`'s context) so that every ledger a fit makes is kept, real and
    unchanged, in the returned list, for the test to read after the fit."""
    ledgers: list[RhoLedger] = []
    original = mechanism.RhoLedger

    def keep(rho: float) -> RhoLedger:
        ledgers.append(original(rho))
        return ledgers[-1]

    patch.setattr(mechanism, "RhoLedger", keep)
    return ledgers
