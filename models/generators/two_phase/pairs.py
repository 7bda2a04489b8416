"""The critic's private query in phase 2 of both two-phase generators: each real example of a Poisson
batch is paired with one fake made from its own row position's latent, and the gradient of the pair's
WGAN loss D(fake) - D(real) over the critic's weights is clipped as ONE vector (DP-auto-GAN's
Algorithm 4, lines 8-11; RDP-CGAN's Algorithm 2, lines 4-14)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from dpsynth.models.generators.dpsgd import per_example_gradients
from dpsynth.models.generators.ghost_clipping import ghost_clipped_sum
from dpsynth.models.privacy.counter_random import normals, stream_base


def check_pairs(real: torch.Tensor, fake: torch.Tensor) -> None:
    if real.shape[0] != fake.shape[0]:
        raise ValueError(f"one fake per real example: got {real.shape[0]} real and {fake.shape[0]} fake rows")


def critic_per_pair(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each (real row j, fake row j) pair's gradient of D(fake_j) - D(real_j): a microbatch of one real
    example with its own fake, clipped as ONE vector."""
    check_pairs(real, fake)

    def loss_one(p: dict[str, torch.Tensor], r: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        scores = functional_call(critic, p, (torch.stack([r, f]),))
        return scores[1] - scores[0]

    return per_example_gradients(critic, loss_one, real, fake.detach())


def critic_pair_clipped_sum(
    critic: nn.Module, real: torch.Tensor, fake: torch.Tensor, clip: float
) -> dict[str, torch.Tensor]:
    """The sum of `critic_per_pair`'s pair gradients, each clipped to `clip` as one vector, computed without
    writing them out (models/generators/ghost_clipping.py): the critic runs once on the real rows and once
    on the fakes, and each layer's two uses in a pair enter its norm together. For critics built of Linear,
    LayerNorm and row-local activations only (DP-auto-GAN's)."""
    check_pairs(real, fake)
    fake = fake.detach()
    return ghost_clipped_sum(critic, lambda: critic(fake) - critic(real), clip)


def position_latents(key: int, update: int, positions: torch.Tensor, z_dim: int) -> torch.Tensor:
    """Standard normal latents [len(positions), z_dim], one vector per (update, row position): a fixed
    function of (key, update, position), drawn by a counter-based generator (SplitMix64 on the counter,
    Box-Muller on two 53-bit uniforms).

    The critic pairs each sampled real row with the fake made from its own position's latent. Drawing
    the fakes in sampled order from a stream instead would make every later row's fake, and everything
    the stream draws afterwards, depend on whether row i was sampled: adding or removing a row would
    move every pair after it, and later updates would depend on a sampling outcome that subsampling's
    amplification must keep hidden from them. Here a row's pair depends on that row, its position (its
    identity: replace-one neighbours share positions) and the update only, and no stream advances."""
    pos = positions.detach().cpu().numpy().astype(np.uint64)
    base = stream_base(key, update)
    with np.errstate(over="ignore"):
        index = base + pos[:, None] * np.uint64(z_dim) + np.arange(z_dim, dtype=np.uint64)[None, :]
    return torch.from_numpy(normals(index).astype(np.float32)).reshape(len(pos), z_dim)
