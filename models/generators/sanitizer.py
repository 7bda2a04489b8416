"""The GS-WGAN gradient sanitiser: the only place where real-data information reaches the generator.
Its row checks (`finite_rows`, `zero_nonfinite_rows`) guard every DP-SGD generator too (dpsgd.py,
DP-auto-GAN's latent Gaussian), so it lives beside the packages rather than in GS-WGAN's.

During a generator step the critic's gradient with respect to each generated row (one row of the
upstream gradient per sample) is clipped to norm C, and Gaussian noise of standard deviation
2 * sigma * C is added (sensitivity 2C under replace-one adjacency: docs/privacy.md section 1). The
sanitised tensor is then backpropagated through G alone.
"""

from __future__ import annotations

import torch


def finite_rows(values: torch.Tensor) -> torch.Tensor:
    """[n] True where row i (everything after the first dimension) holds no NaN or infinity."""
    return torch.isfinite(values.flatten(1) if values.dim() > 1 else values.unsqueeze(1)).all(dim=1)


def zero_nonfinite_rows(values: torch.Tensor) -> torch.Tensor:
    """`values` with every row that holds a NaN or an infinity set to zero. Clipping cannot bound such a
    row (its norm is NaN or infinite, and 0 x inf is NaN), so one diverging row would carry an unbounded
    change into the noisy sum; zeroed, it contributes nothing, which is within any bound. Applied before
    every clipping and every bounded statistic that reads rows."""
    keep = finite_rows(values).reshape((-1,) + (1,) * (values.dim() - 1))
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))


def clip_rows(grad: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row to norm at most `clip` (rows already inside are left unchanged; a row with a NaN or
    an infinity becomes zero)."""
    grad = zero_nonfinite_rows(grad)
    norms = grad.norm(dim=1, keepdim=True)
    factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
    return grad * factor


def sanitize_rows(grad: torch.Tensor, clip: float, noise_multiplier: float, rng: torch.Generator) -> torch.Tensor:
    """clip_rows(grad, C) + N(0, (2 sigma C)^2) per entry, the noise drawn from `rng` (CPU)."""
    noise = torch.randn(grad.shape, generator=rng, dtype=grad.dtype).to(grad.device)
    return noise.mul_(2.0 * noise_multiplier * clip).add_(clip_rows(grad, clip))
