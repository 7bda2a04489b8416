"""DP-auto-GAN's phase 1: the autoencoder's loss and its per-example gradients. Every autoencoder weight,
encoder and decoder together, is clipped and noised (one joint per-example norm: trainer.py's notes say
why the encoder cannot be trained without privacy)."""

from __future__ import annotations

import torch
from torch.func import functional_call

from dpsynth.models.generators.dpautogan.networks import Autoencoder
from dpsynth.models.generators.dpsgd import per_example_gradients
from dpsynth.models.generators.ghost_clipping import ghost_clipped_sum

# Keeps BCE's logarithms finite where a Tanh or softmax output saturates at exactly 0 or 1.
_PROB_EPS = 1e-6


def binary_cross_entropy(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """F.binary_cross_entropy's formula (reduction "none"), without its check that every p lies in [0, 1]:
    a diverged row's NaN must reach the clipping, which gives that row zero weight, rather than stop the
    run (a stop that one row could cause)."""
    return (t - 1.0) * torch.log1p(-p).clamp(min=-100.0) - t * torch.log(p).clamp(min=-100.0)


def reconstruction_loss(recon: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The paper's binary cross entropy on [0, 1]-scaled values, summed over columns (each times its
    weight, when given): one value per row."""
    p = ((recon + 1.0) * 0.5).clamp(_PROB_EPS, 1.0 - _PROB_EPS)
    t = ((rows + 1.0) * 0.5).clamp(0.0, 1.0)
    loss = binary_cross_entropy(p, t)
    return (loss if weights is None else loss * weights).sum(-1)


def autoencoder_per_example(
    ae: Autoencoder, rows: torch.Tensor, weights: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Each row's gradient of its (weighted) reconstruction loss, for encoder AND decoder weights."""

    def loss_one(p, row):
        recon = functional_call(ae, p, (row.unsqueeze(0),))
        return reconstruction_loss(recon, row.unsqueeze(0), weights).squeeze(0)

    return per_example_gradients(ae, loss_one, rows)


def autoencoder_clipped_sum(
    ae: Autoencoder, rows: torch.Tensor, clip: float, weights: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The sum of `autoencoder_per_example`'s rows, each clipped to `clip` (one joint norm), computed
    without writing out per-row gradients (models/generators/ghost_clipping.py: the autoencoder is
    Linear, LayerNorm and row-local activations only)."""
    return ghost_clipped_sum(ae, lambda: reconstruction_loss(ae(rows), rows, weights), clip)
