"""GS-WGAN's privacy schedule: training's epsilon at every checkpoint of the profile's section, before
any budget cuts it (models/privacy/budget.py). Imports no torch: planning a release reads it."""

from __future__ import annotations

import math

from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.generators.gswgan.config import GanConfig, discriminators
from dpsynth.models.privacy.accountant import epsilons_at


def checkpoint_epsilons(
    gan: GanConfig, privacy: PrivacyConfig, setting: Setting, extra_rho: float = 0.0
) -> tuple[list[int], list[float]]:
    """Every checkpoint of the section and training's epsilon at each, with `extra_rho` (replace-one zCDP of
    the measured marginals, read from the same rows) composed into every checkpoint's; no budget applied
    (models/privacy/budget.py cuts the schedule). A non-private setting costs infinity throughout."""
    steps = list(range(0, gan.iterations + 1, gan.checkpoint_every))
    if not setting.private:
        return steps, [math.inf] * len(steps)
    return steps, epsilons_at(
        discriminators(setting),
        steps,
        gan.batch_size,
        privacy.noise_multiplier,
        privacy.delta,
        gan.critic_draw,
        extra_rho,
    )
