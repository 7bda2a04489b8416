"""RDP-CGAN's phase 2 query (the paper's Algorithm 2, lines 4-14): each real row of a Poisson batch is paired
with one fake, the decoder's output for the generator's output, and the gradient of the pair's WGAN loss
D(Dec(G(z))) - D(x) over the critic's weights is clipped as ONE vector (a microbatch of one real row)."""

from __future__ import annotations

import torch
from torch.func import functional_call

from dpsynth.models.generators.dpsgd import per_example_gradients
from dpsynth.models.generators.rdpcgan.networks import Critic


def critic_per_pair(critic: Critic, real: torch.Tensor, fake: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each (real row j, fake row j) pair's gradient of D(fake_j) - D(real_j), per critic parameter."""
    if real.shape[0] != fake.shape[0]:
        raise ValueError(f"one fake per real example: got {real.shape[0]} real and {fake.shape[0]} fake rows")

    def loss_one(p: dict[str, torch.Tensor], r: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        scores = functional_call(critic, p, (torch.stack([r, f]),))
        return scores[1] - scores[0]

    return per_example_gradients(critic, loss_one, real, fake.detach())
