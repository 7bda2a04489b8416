"""RDP-CGAN's phase 2 query (the paper's Algorithm 2, lines 4-14): each real row of a Poisson batch is paired
with one fake, the decoder's output for the generator's output, and the gradient of the pair's WGAN loss
D(Dec(G(z))) - D(x) over the critic's weights is clipped as ONE vector (a microbatch of one real row).

With a gradient penalty (`rdpcgan.critic_penalty`, WGAN-GP's Lipschitz device in place of weight
clipping), the pair's loss adds penalty * (||grad D(x_hat)|| - 1)^2 at x_hat = m x + (1 - m) fake: it
reads only the pair's own two rows and its own mixing weight m, so the pair still moves the clipped sum
by at most C and the accountant's analysis is unchanged."""

from __future__ import annotations

import torch
from torch.func import functional_call, grad

from dpsynth.models.generators.dpsgd import per_example_gradients
from dpsynth.models.generators.rdpcgan.networks import Critic
from dpsynth.models.generators.two_phase.pairs import check_pairs
from dpsynth.models.generators.two_phase.pairs import critic_per_pair as plain_critic_per_pair

_NORM_EPS = 1e-12


def critic_per_pair(
    critic: Critic, real: torch.Tensor, fake: torch.Tensor, mix: torch.Tensor | None = None, penalty: float = 0.0
) -> dict[str, torch.Tensor]:
    """Each (real row j, fake row j) pair's gradient of D(fake_j) - D(real_j) (plus its gradient penalty
    at the mix `mix[j]` when `penalty` > 0), per critic parameter."""
    check_pairs(real, fake)
    if penalty <= 0.0:
        return plain_critic_per_pair(critic, real, fake)
    if mix is None or mix.shape[0] != real.shape[0]:
        raise ValueError("a gradient penalty needs one mixing weight in [0, 1] per pair")

    def penalised_one(p: dict[str, torch.Tensor], r: torch.Tensor, f: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        scores = functional_call(critic, p, (torch.stack([r, f]),))
        between = (m * r + (1.0 - m) * f).unsqueeze(0)
        slope = grad(lambda x: functional_call(critic, p, (x,)).sum())(between)
        norm = torch.sqrt((slope * slope).sum() + _NORM_EPS)  # finite gradient at a flat point
        return scores[1] - scores[0] + penalty * (norm - 1.0) ** 2

    return per_example_gradients(critic, penalised_one, real, fake.detach(), mix.reshape(-1, 1))
