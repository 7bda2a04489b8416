"""DP-SGD's pieces, shared by the DP-CGAN and DP-auto-GAN trainers: Poisson sampling of a batch,
per-example gradients, clipping of each example's gradient, and Gaussian noise on the clipped sum.

The accountant (models/privacy/dpsgd_accountant.py, Opacus's RDP analysis of the sampled Gaussian)
covers exactly this: every row joins a batch independently with the public rate q, each row's gradient
(over all parameters together) moves the sum by at most C, and one draw of N(0, (sigma C)^2) per entry
is added to that sum, which is then divided by the public expected batch q n, never the drawn size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import grad, vmap

from dpsynth.models.generators.sanitizer import finite_rows

# Added to a per-example norm before dividing by it (Opacus adds the same): no division by zero.
NORM_EPS = 1e-6


def poisson_batch(n_rows: int, sample_rate: float, rng: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson batch: each row independently with probability `sample_rate`."""
    return (torch.rand(n_rows, generator=rng) < sample_rate).nonzero().squeeze(1)


def per_example_gradients(module: nn.Module, loss_one: Callable, *batched: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients of `loss_one(params, *one_row_each)` for every trainable parameter of
    `module`: shape [rows, *parameter shape]. An empty batch gives zero rows."""
    params = {k: v.detach() for k, v in module.named_parameters() if v.requires_grad}
    if batched[0].shape[0] == 0:
        return {k: v.new_zeros((0, *v.shape)) for k, v in params.items()}
    return vmap(grad(loss_one), in_dims=(None,) + (0,) * len(batched))(params, *batched)


def clipped_sum(per_sample: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """Sum over rows of each row's gradient scaled to L2 norm at most `clip` (norm over all parameters
    together, as DP-SGD's sensitivity needs). A row whose gradient holds a NaN or an infinity in any
    parameter contributes zero (its norm would not bound it: models/generators/sanitizer.py
    `zero_nonfinite_rows`)."""
    flat = torch.cat([g.flatten(1) for g in per_sample.values()], 1)  # also for an empty Poisson batch (0 rows)
    finite = finite_rows(flat)
    norms = torch.where(finite[:, None], flat, 0.0).norm(dim=1)
    factors = torch.where(finite, (clip / (norms + NORM_EPS)).clamp(max=1.0), 0.0)
    return {
        k: torch.einsum("n,n...->...", factors, torch.where(_rows_mask(finite, g), g, 0.0))
        for k, g in per_sample.items()
    }


def _rows_mask(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return rows.reshape((-1,) + (1,) * (like.dim() - 1))


def gaussian_noise(like: dict[str, torch.Tensor], std: float, rng: torch.Generator | None) -> dict[str, torch.Tensor]:
    """One N(0, std^2) draw per entry of each tensor of `like`, from `rng` in `like`'s order (zeros when
    std is 0)."""
    return {
        k: (
            torch.randn(g.shape, generator=rng, dtype=g.dtype, device=g.device).mul_(std)
            if std > 0
            else torch.zeros_like(g)
        )
        for k, g in like.items()
    }


@dataclass
class SanitizedGradient:
    """One private update's gradient, per parameter name: `total` = (clipped_sum + noise) / expected batch."""

    clipped_sum: dict[str, torch.Tensor]
    noise: dict[str, torch.Tensor]
    total: dict[str, torch.Tensor]


def noisy_mean(
    summed: dict[str, torch.Tensor],
    clip: float,
    noise_multiplier: float,
    expected_batch: float,
    noise_rng: torch.Generator | None,
) -> SanitizedGradient:
    """DP-SGD's sanitised mean from the clipped sum: `summed` is the sum of the examples' gradients each
    clipped to `clip`, one joint norm over all parameters (`clipped_sum`, or models/generators/
    ghost_clipping.py's `ghost_clipped_sum`, the same sum computed without per-example gradients); ONE
    draw of N(0, (noise_multiplier clip)^2 I) per entry from `noise_rng`, in parameter order, divided by
    the public expected batch q m (the drawn batch size is not public)."""
    noise = gaussian_noise(summed, noise_multiplier * clip, noise_rng)
    total = {k: (summed[k] + noise[k]) / expected_batch for k in summed}
    return SanitizedGradient(summed, noise, total)


def apply_gradient(module: nn.Module, total: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
    """Step `optimizer` with exactly the sanitised gradient (any stale gradient is overwritten)."""
    for name, p in module.named_parameters():
        p.grad = total[name]
    optimizer.step()
