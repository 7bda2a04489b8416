"""What a table's releases cost together: sequential composition across releases.

Each release of a table reads the same people's rows again, so releases compose sequentially: nothing
else makes their costs parallel (each release draws its own split, so a row used for validation in one
release trains the generator of the next). Two bounds on the composition hold; the lifetime cost is the
smaller, at delta = the sum of the releases' deltas:

* basic composition: the sum of the releases' epsilons;
* RDP composition (Mironov 2017), for releases whose cost comes with a replace-one RDP curve
  (GS-WGAN's training curve from models/privacy/accountant.py, with the measured marginals' line alpha x rho
  added where the release measured them, and the pure-DP checkpoint choice; the DP-SGD
  generators' curves are add/remove-one, so their releases add their published epsilon instead): the per-row RDP of
  a release at
  order alpha is the larger of training's and the choice's when they read disjoint rows (a row plays
  one role in a release), their sum otherwise; the releases' curves add order by order and the sum is
  converted once with the classic formula  eps = min over alpha of RDP(alpha) + log(1/delta)/(alpha-1).
  Pure epsilon-DP has RDP at most min(epsilon, alpha epsilon^2 / 2) (Bun and Steinke 2016, Prop. 3.3).
  Releases without a curve (other accountants) add their epsilon to the result.

Many releases at epsilon 10 compose to much less than 10 per release under RDP; one release costs what
it published (the basic bound).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from dpsynth.models.config import Profile, Setting
from dpsynth.models.privacy.accountant import training_rdp


@dataclass(frozen=True)
class TrainingCurve:
    """What the accountant needs to rebuild a release's training RDP curve."""

    discriminators: int
    iterations: int
    batch_size: int
    noise_multiplier: float
    critic_draw: str
    # The measured marginals' replace-one zCDP (RDP order x rho), read from the same training rows.
    marginals_rho: float = 0.0


@dataclass(frozen=True)
class ReleaseCost:
    """One release's cost: the whole release's (epsilon, delta) as published, and, when known, how it is
    made (training's RDP curve, the pure-DP choice's epsilon, whether they read disjoint rows)."""

    epsilon: float
    delta: float
    training: TrainingCurve | None = None
    choice_epsilon: float = 0.0
    disjoint: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> ReleaseCost:
        training = raw.get("training")
        return cls(
            epsilon=float(raw["epsilon"]),
            delta=float(raw["delta"]),
            training=TrainingCurve(**training) if training else None,
            choice_epsilon=float(raw.get("choice_epsilon", 0.0)),
            disjoint=bool(raw.get("disjoint", True)),
        )

    def rdp(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(orders, per-row RDP) of the whole release, or None without a training curve."""
        if self.training is None:
            return None
        t = self.training
        orders, train = training_rdp(
            t.discriminators, t.iterations, t.batch_size, t.noise_multiplier, t.critic_draw, t.marginals_rho
        )
        eps = self.choice_epsilon
        choice = np.minimum(eps, orders * eps * eps / 2.0)
        return orders, (np.maximum(train, choice) if self.disjoint else train + choice)


@dataclass(frozen=True)
class LifetimeCost:
    epsilon: float
    delta: float
    basic_epsilon: float
    releases: int


def _convert(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    values = rdp + math.log(1.0 / delta) / (orders - 1.0)
    return float(np.min(values))


def lifetime_cost(costs: list[ReleaseCost]) -> LifetimeCost:
    """The table's cost after `costs` (the smaller of the basic and the RDP composition)."""
    if not costs:
        return LifetimeCost(0.0, 0.0, 0.0, 0)
    delta = sum(c.delta for c in costs)
    basic = sum(c.epsilon for c in costs)
    if math.isinf(basic):
        return LifetimeCost(math.inf, delta, math.inf, len(costs))
    curves = [(c, c.rdp()) for c in costs]
    with_curve = [(c, r) for c, r in curves if r is not None]
    if not with_curve:
        return LifetimeCost(basic, delta, basic, len(costs))
    orders = with_curve[0][1][0]
    total_rdp = np.sum([r[1] for _, r in with_curve], axis=0)
    curve_delta = sum(c.delta for c, _ in with_curve)
    rest = sum(c.epsilon for c, r in curves if r is None)
    composed = _convert(orders, total_rdp, curve_delta) + rest
    return LifetimeCost(min(basic, composed), delta, basic, len(costs))


def release_cost(profile: Profile, setting: Setting, epsilon: float, curve: TrainingCurve | None) -> ReleaseCost:
    """The cost of a release of `setting` whose whole-release epsilon (training with the DP choice,
    models/privacy/release_choice.py) is `epsilon`; `curve`: its generator's replace-one training curve
    to the trained checkpoint, or None where the generator has none (the release then adds its epsilon)."""
    from dpsynth.models.privacy.release_choice import decision_epsilon

    privacy = profile.privacy
    if not setting.private:
        return ReleaseCost(math.inf, privacy.delta)
    return ReleaseCost(float(epsilon), privacy.delta, curve, decision_epsilon(profile), profile.protocol == "honest")
