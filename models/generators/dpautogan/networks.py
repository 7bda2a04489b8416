"""DP-auto-GAN's networks: the autoencoder (encoder and decoder), the latent generator, the Gaussian
latent model, the critic, and the spec stored beside a released decoder and latent model.

Fully connected, LayerNorm and LeakyReLU(0.2) in hidden layers (no BatchNorm anywhere: the paper's
generators use BatchNorm, but a row's output should not depend on its batch, and the private modules
must pass Opacus's ModuleValidator); the encoder and the generator end in Tanh so that real and generated
latents share the range [-1, 1]; the decoder ends in GS-WGAN's `OutputHead` (models/generators/networks.py;
"typed": Tanh per single column, softmax per one-hot group mapped to [-1, 1]) so decoded categorical
groups are valid distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpsynth.models.generators.networks import LEAKY_SLOPE
from dpsynth.models.generators.two_phase.networks import HeadedDecoder, LatentReleaseSpec


def _mlp(width: int, hidden: tuple[int, ...], out: int) -> list[nn.Module]:
    """Linear / LayerNorm / LeakyReLU(0.2) hidden layers, then a Linear to `out`. LayerNorm, not
    BatchNorm: it works on one row at a time, so a row's per-example gradient (and its clipped
    contribution) does not depend on the other rows of the batch."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.LeakyReLU(LEAKY_SLOPE)]
        width = h
    layers.append(nn.Linear(width, out))
    return layers


class Autoencoder(nn.Module):
    """Encoder rows -> latents in [-1, 1] (Tanh); decoder latents -> rows through `OutputHead`."""

    def __init__(
        self,
        width: int,
        latent_dim: int,
        encoder_hidden: tuple[int, ...],
        decoder_hidden: tuple[int, ...],
        head: str,
        groups,
    ):
        super().__init__()
        self.encoder = nn.Sequential(*_mlp(width, encoder_hidden, latent_dim), nn.Tanh())
        self.decoder = Decoder(latent_dim, decoder_hidden, width, head, groups)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(rows))


class Decoder(HeadedDecoder):
    """Latents -> encoded rows in [-1, 1]; "typed" keeps each one-hot group a distribution."""

    def __init__(self, latent_dim: int, hidden: tuple[int, ...], width: int, head: str, groups):
        super().__init__(nn.Sequential(*_mlp(latent_dim, hidden, width)), width, head, groups)


class LatentGenerator(nn.Module):
    """z -> latents in [-1, 1] (the encoder's range). Trained without privacy: it reads no data."""

    def __init__(self, z_dim: int, hidden: tuple[int, ...], latent_dim: int):
        super().__init__()
        self.z_dim = z_dim
        self.body = nn.Sequential(*_mlp(z_dim, hidden, latent_dim), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.body(z)


class GaussianLatent(nn.Module):
    """z ~ N(0, I) -> mean + scale z, clipped to the encoder's range [-1, 1]: the "gaussian" latent model.
    `mean` and `scale` (a Cholesky factor of the covariance) are buffers, set by `fit_gaussian_latent`."""

    mean: torch.Tensor
    scale: torch.Tensor

    def __init__(self, latent_dim: int):
        super().__init__()
        self.z_dim = latent_dim
        self.register_buffer("mean", torch.zeros(latent_dim))
        self.register_buffer("scale", torch.eye(latent_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (self.mean + z @ self.scale.T).clamp(-1.0, 1.0)


class Critic(nn.Module):
    """Rows (or latents) -> one WGAN score per row; linear output."""

    def __init__(self, in_width: int, hidden: tuple[int, ...]):
        super().__init__()
        self.body = nn.Sequential(*_mlp(in_width, hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


@dataclass(frozen=True)
class ReleaseSpec(LatentReleaseSpec):
    """Everything needed to rebuild the released decoder and latent model, stored beside their weights: the
    shared fields (width, latent_dim, z_dim), then DP-auto-GAN's."""

    decoder_hidden: tuple[int, ...]
    generator_hidden: tuple[int, ...]
    head: str
    groups: tuple[tuple[int, int, str], ...]
    # Files written before these options existed decoded by argmax and had a GAN's generator.
    level_decoding: str = "argmax"
    latent_model: str = "gan"

    def build(self) -> tuple[Decoder, LatentGenerator | GaussianLatent]:
        latent = (
            GaussianLatent(self.latent_dim)
            if self.latent_model == "gaussian"
            else LatentGenerator(self.z_dim, self.generator_hidden, self.latent_dim)
        )
        return Decoder(self.latent_dim, self.decoder_hidden, self.width, self.head, self.groups), latent

    @classmethod
    def from_dict(cls, d: dict) -> ReleaseSpec:
        return cls(
            *cls.shared_fields(d),
            tuple(d["decoder_hidden"]),
            tuple(d["generator_hidden"]),
            d["head"],
            tuple((int(a), int(b), str(c)) for a, b, c in d["groups"]),
            d.get("level_decoding", "argmax"),
            d.get("latent_model", "gan"),
        )
