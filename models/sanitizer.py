"""The GS-WGAN gradient sanitiser: the only place where real-data information reaches the generator.

During a generator step the critic's gradient with respect to each generated row (one row of the
upstream gradient per sample) is clipped to norm C, and Gaussian noise of standard deviation
2 * sigma * C is added (sensitivity 2C under replace-one adjacency; REFERENCE.md section 1). The
sanitised tensor is then backpropagated through G alone.
"""

from __future__ import annotations

import torch


def clip_rows(grad: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row to norm at most `clip` (rows already inside are left unchanged)."""
    norms = grad.norm(dim=1, keepdim=True)
    factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
    return grad * factor


def sanitize_rows(grad: torch.Tensor, clip: float, noise_multiplier: float, rng: torch.Generator) -> torch.Tensor:
    """clip_rows(grad, C) + N(0, (2 sigma C)^2) per entry, the noise drawn from `rng` (CPU)."""
    noise = torch.randn(grad.shape, generator=rng, dtype=grad.dtype).to(grad.device)
    return noise.mul_(2.0 * noise_multiplier * clip).add_(clip_rows(grad, clip))
