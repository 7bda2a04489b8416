"""RDP-CGAN's phase 1 (the paper's Algorithm 1): the reconstruction loss and each row's gradient of it over
every autoencoder weight, encoder and decoder together (one joint norm is clipped: the paper clips and
noises both, since the decoder's later updates are computed through the encoder)."""

from __future__ import annotations

import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.models.generators.dpsgd import per_example_gradients
from dpsynth.models.generators.rdpcgan.networks import Autoencoder

# Keeps BCE's logarithms finite where a Tanh or softmax output saturates at exactly 0 or 1.
_PROB_EPS = 1e-6
LOSSES = ("mse", "bce")


def reconstruction_loss(recon: torch.Tensor, rows: torch.Tensor, loss: str) -> torch.Tensor:
    """One value per row: "mse", the mean squared error over the encoded columns (the paper's Eq. 2);
    "bce", the binary cross entropy of values scaled to [0, 1], averaged over columns (Eq. 1)."""
    if loss == "mse":
        return ((recon - rows) ** 2).mean(-1)
    if loss == "bce":
        p = ((recon + 1.0) * 0.5).clamp(_PROB_EPS, 1.0 - _PROB_EPS)
        t = ((rows + 1.0) * 0.5).clamp(0.0, 1.0)
        return F.binary_cross_entropy(p, t, reduction="none").mean(-1)
    raise ValueError(f"the reconstruction loss must be one of {', '.join(LOSSES)}, got {loss!r}")


def autoencoder_per_example(ae: Autoencoder, rows: torch.Tensor, loss: str) -> dict[str, torch.Tensor]:
    """Each row's gradient of its reconstruction loss, for encoder AND decoder weights."""

    def loss_one(p: dict[str, torch.Tensor], row: torch.Tensor) -> torch.Tensor:
        recon = functional_call(ae, p, (row.unsqueeze(0),))
        return reconstruction_loss(recon, row.unsqueeze(0), loss).squeeze(0)

    return per_example_gradients(ae, loss_one, rows)
