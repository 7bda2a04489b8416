"""DP-Fed-CTGAN's accounting: record-level DP per site, parallel composition across sites.

Each site runs two mechanisms on its own rows only: its noisy counts, once (Gaussian, add/remove-one
zCDP 1 / (2 counts_noise^2): conditions.py), and its discriminator's DP-SGD updates (the sampled
Gaussian, Opacus's add/remove-one RDP, one composition per update). Their RDP curves add order by order
(with the measured marginals' where the profile measures them: those read every training row, so they
compose sequentially with every site), and the sum is turned into a replace-one epsilon once, by group
privacy over a removal and an addition (models/privacy/dpsgd_accountant.py `replace_one_epsilon`).

Sites hold disjoint rows, so a replaced row touches one site's mechanisms (same site) or the removal one
site's and the addition another's (a split by column): either way the release's training epsilon is the
largest site's (parallel composition; the group-privacy bound of the worst site covers a removal at one
site and an addition at another). The server's averaging and everything after it are post-processing.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.privacy.dpsgd_accountant import Phase, replace_one_epsilon


def counts_rho(config: DPFedCTGANConfig) -> float:
    """Add/remove-one zCDP of a site's noisy counts (noise counts_noise times their L2 sensitivity)."""
    return 1.0 / (2.0 * config.counts_noise**2)


def site_epsilon(phases: Sequence[Phase], site_counts_rho: float, delta: float, marginals_rho: float = 0.0) -> float:
    """One site's replace-one epsilon: its DP-SGD phases, its counts and the measured marginals."""
    return replace_one_epsilon(list(phases), delta, extra_rho=site_counts_rho + marginals_rho)


def release_epsilon(sites: Sequence[tuple[Sequence[Phase], float]], delta: float, marginals_rho: float = 0.0) -> float:
    """The release's training epsilon: the worst site's (parallel composition over disjoint sites).
    `sites`: each site's (DP-SGD phases, counts rho) as its accountant recorded them."""
    return max(site_epsilon(phases, rho, delta, marginals_rho) for phases, rho in sites)


def planned_site_phase(config: DPFedCTGANConfig, rounds: int) -> Phase:
    """What every site runs by the end of `rounds` rounds: local_steps updates per round at (q, sigma)."""
    return Phase(config.sample_rate, config.noise_multiplier, int(rounds) * config.local_steps)
