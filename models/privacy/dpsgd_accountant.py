"""Privacy accountant for generators trained with DP-SGD (DP-CGAN, DP-auto-GAN).

DP-SGD draws each batch by Poisson sampling (every row independently with probability q), clips each
row's gradient to C and adds N(0, sigma^2 C^2) noise: the sampled Gaussian mechanism, whose RDP Opacus
computes exactly (Mironov, Talwar and Zhang 2019; `opacus.accountants.analysis.rdp.compute_rdp`). That
analysis holds for Poisson sampling under add/remove-one adjacency only: a trainer that draws fixed-size
batches without replacement, or partitions the rows (GS-WGAN, models/privacy/accountant.py), needs another
accountant, and the two must not be mixed.

One composition per sanitised query. DP-CGAN clips the real and the fake gradients separately and noises
only their sum: the fake part does not read the data, so each discriminator update is ONE query at
noise multiplier sigma. DP-auto-GAN counts one query per autoencoder step and one per critic step; the
generator reads no data. Counting the real and fake parts as two queries (or noising both) would double
the compositions: the tests pin the published epsilons so that such a miscount fails.

A training run is a list of phases (sample rate, noise multiplier, steps). Their RDP adds order by order
(Mironov 2017, Prop. 1) and the sum is converted once (DP-auto-GAN's Lemma 1), which beats converting
each phase at delta / 2 and adding the epsilons. Two conversions:

* "classic" (Mironov 2017, Prop. 3; what both papers report):
  epsilon = min over alpha of RDP(alpha) + log(1/delta) / (alpha - 1);
* "opacus" (Balle et al. 2020, Thm. 21; Opacus's default `get_privacy_spent`): tighter, smaller numbers.
Say which one a number used.

The order grid is Opacus's default (1.1 .. 10.9 in steps of 0.1, then 12 .. 63) extended to 1024:
DP-auto-GAN's optima sit at orders 60-124, past Opacus's last order. Every order gives a valid bound,
so a coarser grid only loosens epsilon. `rdp_curve` also evaluates any other grid (for instance
GS-WGAN's integer orders 2 .. 100) so that models/privacy/lifetime.py can add curves order by order; note that
GS-WGAN's curve is for replace-one adjacency, this one for add/remove-one.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.accountant import check_delta, check_noise_multiplier
from dpsynth.models.privacy.checks import check_extra_rho, is_int, is_real


def _opacus_rdp() -> ModuleType:
    """Opacus's RDP analysis module, loaded on its own: `import opacus` imports torch (seconds), and the
    analysis needs only numpy and scipy; budget checks and the lifetime cost should not pay for torch."""
    name = "opacus.accountants.analysis.rdp"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("opacus")  # locates the package without running its __init__
    if spec is None or spec.origin is None:
        raise ImportError("opacus is not installed; models/privacy/dpsgd_accountant.py uses its RDP analysis")
    path = Path(spec.origin).parent / "accountants" / "analysis" / "rdp.py"
    module_spec = importlib.util.spec_from_file_location("models._opacus_rdp", path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load Opacus's RDP analysis from {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


_RDP = _opacus_rdp()
compute_rdp = _RDP.compute_rdp
get_privacy_spent = _RDP.get_privacy_spent

MECHANISM = (
    "Poisson-subsampled Gaussian (DP-SGD), RDP of Opacus's sampled Gaussian mechanism analysis, "
    "add/remove-one adjacency, one composition per sanitised update; phases composed order by order"
)
CONVERSIONS = ("classic", "opacus")

_OPACUS_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
ORDERS: tuple[float, ...] = tuple(
    float(a) for a in _OPACUS_ORDERS + list(range(64, 256)) + [256, 320, 384, 448, 512, 640, 768, 1024]
)


# ----------------------------------------------------------------------------------------- validation


def _check_sample_rate(sample_rate: object) -> float:
    if not is_real(sample_rate) or not 0 < float(sample_rate) <= 1:
        raise ConfigError(
            f"the sample rate q (each row's probability of entering a batch: expected batch size / rows) must "
            f"be a number in (0, 1], got {sample_rate!r}"
        )
    return float(sample_rate)


def _check_steps(steps: object, what: str = "the number of steps") -> int:
    if not is_int(steps) or int(steps) < 0:
        raise ConfigError(f"{what} must be an integer >= 0, got {steps!r}")
    return int(steps)


def _check_conversion(conversion: object) -> str:
    if conversion not in CONVERSIONS:
        raise ConfigError(f"the RDP conversion must be one of {', '.join(CONVERSIONS)}, got {conversion!r}")
    return str(conversion)


def _check_orders(orders: Iterable[object] | None) -> tuple[float, ...]:
    if orders is None:
        return ORDERS
    try:
        values = tuple(orders)
    except TypeError:
        raise ConfigError(f"RDP orders must be a sequence of numbers > 1, got {orders!r}") from None
    above_one = [float(a) for a in values if is_real(a) and float(a) > 1]
    if not values or len(above_one) != len(values):
        raise ConfigError(f"RDP orders must be a non-empty sequence of finite numbers > 1, got {orders!r}")
    return tuple(above_one)


# ------------------------------------------------------------------------------------------- phases


@dataclass(frozen=True)
class Phase:
    """A stretch of training that runs the same sanitised query: `steps` updates, each sampling rows with
    probability `sample_rate` and adding noise `noise_multiplier` times the clipping norm."""

    sample_rate: float
    noise_multiplier: float
    steps: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "sample_rate", _check_sample_rate(self.sample_rate))
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "steps", _check_steps(self.steps))

    def to_dict(self) -> dict:
        return {"sample_rate": self.sample_rate, "noise_multiplier": self.noise_multiplier, "steps": self.steps}

    @classmethod
    def from_dict(cls, raw: object) -> Phase:
        if not isinstance(raw, dict) or set(raw) != {"sample_rate", "noise_multiplier", "steps"}:
            raise ConfigError(
                f"a phase must be a mapping with exactly sample_rate, noise_multiplier and steps, got {raw!r}"
            )
        return cls(raw["sample_rate"], raw["noise_multiplier"], raw["steps"])


def _check_phases(phases: object) -> list[Phase]:
    if isinstance(phases, Phase):
        return [phases]
    if isinstance(phases, (str, bytes, dict)) or not isinstance(phases, Iterable):
        raise ConfigError(f"phases must be a Phase or a sequence of Phase, got {phases!r}")
    out = list(phases)
    bad = [p for p in out if not isinstance(p, Phase)]
    if bad:
        raise ConfigError(f"phases must be Phase(sample_rate, noise_multiplier, steps) objects, got {bad[0]!r}")
    return out


# ------------------------------------------------------------------------------------ RDP and epsilon


@functools.lru_cache(maxsize=256)
def _unit_rdp(sample_rate: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of ONE step, cached: steps only scale it (RDP composes linearly), so a stateful accountant
    asking after every update costs a multiplication."""
    rdp = np.asarray(
        compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)), dtype=float
    )
    rdp.setflags(write=False)
    return rdp


def rdp_curve(phases: Phase | Sequence[Phase], orders: Iterable[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each order) of all phases composed: the curve other releases' curves add to
    (models/privacy/lifetime.py). `orders` defaults to ORDERS."""
    checked = _check_phases(phases)
    grid = _check_orders(orders)
    total = np.zeros(len(grid))
    for phase in checked:
        if phase.steps:
            total = total + phase.steps * _unit_rdp(phase.sample_rate, phase.noise_multiplier, grid)
    return np.asarray(grid, dtype=float), total


def _convert(orders: np.ndarray, rdp: np.ndarray, delta: float, conversion: str) -> float:
    if conversion == "classic":
        values = rdp + math.log(1.0 / delta) / (orders - 1.0)
        eps = float(np.nanmin(values))
    else:
        eps = float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])
    return eps if math.isfinite(eps) else math.inf


def epsilon(
    phases: Phase | Sequence[Phase], delta: float, conversion: str = "classic", orders: Iterable[float] | None = None
) -> float:
    """Epsilon at `delta` of all phases together (their RDP added at each order, then converted once)."""
    d = check_delta(delta)
    conv = _check_conversion(conversion)
    checked = _check_phases(phases)
    grid, rdp = rdp_curve(checked, orders)
    if not any(p.steps for p in checked):
        return 0.0  # nothing was released
    return _convert(grid, rdp, d, conv)


def replace_one_epsilon(
    phases: Phase | Sequence[Phase],
    delta: float,
    conversion: str = "classic",
    orders: Iterable[float] | None = None,
    extra_rho: float = 0.0,
) -> float:
    """Epsilon at `delta` under replace-one adjacency, dpsynth's unit of privacy, from the add/remove-one
    analysis above: a replacement is a removal followed by an addition, and group privacy over those two
    steps turns (eps, d)-DP into (2 eps, (1 + e^eps) d)-DP. The add/remove delta d is the largest with
    (1 + e^eps(d)) d <= delta (bisection on log d), so the result is valid at `delta` itself. Loose (a
    replace-one analysis of the sampled Gaussian would be tighter) but never below the truth.

    `extra_rho`: the ADD/REMOVE-ONE zCDP of another mechanism on the same rows (the measured marginals,
    RDP alpha x rho), added to the phases' curve order by order before the conversion: the whole
    add/remove-one guarantee is then turned into a replace-one one, once."""
    d = check_delta(delta)
    conv = _check_conversion(conversion)
    checked = _check_phases(phases)
    extra = check_extra_rho(extra_rho)
    if not any(p.steps for p in checked) and not extra:
        return 0.0
    grid, rdp = rdp_curve(checked, orders)
    rdp = rdp + extra * grid

    def fits(log_d: float) -> tuple[bool, float]:
        eps = _convert(grid, rdp, math.exp(log_d), conv)
        return (1.0 + math.exp(min(eps, 700.0))) * math.exp(log_d) <= d, eps

    low, high = math.log(d) - 60.0, math.log(d / 2.0)  # (1 + e^eps) >= 2: d/2 is the most it can be
    ok, eps_low = fits(low)
    if not ok:
        return math.inf
    for _ in range(60):
        mid = (low + high) / 2.0
        ok, eps_mid = fits(mid)
        if ok:
            low, eps_low = mid, eps_mid
        else:
            high = mid
    return 2.0 * eps_low


# ------------------------------------------------------------------------------- stateful accountant


class DPSGDAccountant:
    """Counts sanitised updates as training runs: call `step()` once per discriminator / critic (or
    private autoencoder) update, never per loss term; `begin_phase` when the sample rate or noise changes
    (DP-auto-GAN: from the autoencoder to the critic)."""

    def __init__(self, sample_rate: float, noise_multiplier: float):
        self._phases: list[Phase] = [Phase(sample_rate, noise_multiplier, 0)]

    @property
    def mechanism(self) -> str:
        return MECHANISM

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The phases accounted so far, the current one last."""
        return tuple(self._phases)

    @property
    def steps(self) -> int:
        """Sanitised updates (compositions) accounted so far, all phases together."""
        return sum(p.steps for p in self._phases)

    @property
    def sample_rate(self) -> float:
        return self._phases[-1].sample_rate

    @property
    def noise_multiplier(self) -> float:
        return self._phases[-1].noise_multiplier

    def step(self, updates: int = 1) -> None:
        """Account `updates` sanitised updates in the current phase."""
        n = _check_steps(updates, "the number of updates")
        current = self._phases[-1]
        self._phases[-1] = Phase(current.sample_rate, current.noise_multiplier, current.steps + n)

    def begin_phase(self, sample_rate: float, noise_multiplier: float) -> None:
        """Later updates run at a new sample rate or noise; the earlier ones stay accounted."""
        new = Phase(sample_rate, noise_multiplier, 0)
        current = self._phases[-1]
        if (new.sample_rate, new.noise_multiplier) == (current.sample_rate, current.noise_multiplier):
            return
        if current.steps == 0 and len(self._phases) > 1:
            self._phases[-1] = new  # the empty phase recorded nothing
        else:
            self._phases.append(new)

    def rdp_curve(self, orders: Iterable[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        return rdp_curve(self._phases, orders)

    def epsilon(self, delta: float, conversion: str = "classic") -> float:
        return epsilon(self._phases, delta, conversion)

    def state_dict(self) -> dict:
        """A plain JSON-serialisable snapshot."""
        return {"mechanism": MECHANISM, "phases": [p.to_dict() for p in self._phases]}

    def load_state_dict(self, state: dict) -> None:
        """Restore the history of `state_dict()`.

        The history's last phase must run this accountant's current query: updates counted from here on
        are added to it, and counting them at another sample rate or noise would misstate epsilon.
        """
        phases = self._parse_state(state)
        last, current = phases[-1], self._phases[-1]
        if (last.sample_rate, last.noise_multiplier) != (current.sample_rate, current.noise_multiplier):
            raise ConfigError(
                f"accountant state ends with sample rate {last.sample_rate!r} and noise multiplier "
                f"{last.noise_multiplier!r}, but this accountant runs sample rate {current.sample_rate!r} and "
                f"noise multiplier {current.noise_multiplier!r}"
            )
        self._phases = phases

    @classmethod
    def from_state_dict(cls, state: dict) -> DPSGDAccountant:
        """A new accountant with the history of `state`, continuing its last phase."""
        phases = cls._parse_state(state)
        acct = cls(phases[-1].sample_rate, phases[-1].noise_multiplier)
        acct._phases = phases
        return acct

    @staticmethod
    def _parse_state(state: object) -> list[Phase]:
        if not isinstance(state, dict):
            raise ConfigError(f"accountant state must be a mapping, got {type(state).__name__}")
        if set(state) != {"mechanism", "phases"}:
            raise ConfigError(f"accountant state must have exactly the keys mechanism and phases, got {sorted(state)}")
        if state["mechanism"] != MECHANISM:
            raise ConfigError(
                f"accountant state was recorded for another mechanism ({state['mechanism']!r}); this accountant "
                f"composes {MECHANISM!r}"
            )
        raw = state["phases"]
        if not isinstance(raw, list) or not raw:
            raise ConfigError(f"accountant state must list at least one phase, got {raw!r}")
        return [Phase.from_dict(p) for p in raw]

    def __repr__(self) -> str:
        return f"DPSGDAccountant(phases={list(self._phases)!r})"


__all__ = ["CONVERSIONS", "MECHANISM", "ORDERS", "DPSGDAccountant", "Phase", "epsilon", "rdp_curve"]
