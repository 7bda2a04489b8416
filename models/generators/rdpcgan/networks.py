"""RDP-CGAN's networks: 1-D convolutions over the encoded row, read as a one-channel sequence of its
columns (neighbouring columns share a kernel: the paper's reason for convolutions).

* `ConvStack`: convolutions with stride 2 (each halves the length) and PReLU: the encoder's body and
  the critic's body (the paper: five layers each, the critic's last layer a dense output of size 1).
* `UpConvStack`: a dense layer to a short sequence, then transposed convolutions (kernel 4, stride 2:
  each doubles the length) and PReLU, the last one to a single channel, cropped to the output length:
  the decoder's body and the generator's (the paper's fractionally-strided convolutions).
* `Encoder` rows -> encoded rows in [-1, 1] (Tanh, the paper's); `Decoder` encoded rows -> rows through
  GS-WGAN's `OutputHead` ("typed": Tanh per single column, softmax per one-hot group mapped to [-1, 1]:
  the paper's Sigmoid on [0, 1] data, on dpsynth's [-1, 1] encoding; `Decoder.relaxed`: the same rows
  with relaxed draws of their levels, what the critic reads); `Generator` z -> encoded rows in
  [-1, 1] (Tanh, so real and generated encodings share a range); `Critic` rows -> one WGAN score.

No BatchNorm (the paper's generator and critic use it): a row's output must not depend on its batch,
and the private modules must pass Opacus's ModuleValidator. Weights are initialised from a seeded
generator (`init_from_`), so the profile's seed fixes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.networks import apply_head, binary_columns
from dpsynth.models.generators.two_phase.networks import Group, HeadedDecoder, LatentReleaseSpec

# The transposed convolutions' kernel, stride and padding: exactly doubles a length.
UP_KERNEL, UP_STRIDE, UP_PADDING = 4, 2, 1


def conv_lengths(length: int, layers: int, kernel: int) -> list[int]:
    """The sequence length after each stride-2 convolution (padding kernel // 2), the input's first."""
    lengths = [length]
    for _ in range(layers):
        lengths.append((lengths[-1] + 2 * (kernel // 2) - kernel) // 2 + 1)
    if lengths[-1] < 1:
        raise ConfigError(f"rdpcgan.kernel_size {kernel} is too large for a row of {length} encoded columns")
    return lengths


class ConvStack(nn.Module):
    """[rows, length] -> [rows, channels[-1] x final length]: stride-2 convolutions with PReLU."""

    def __init__(self, length: int, channels: tuple[int, ...], kernel: int):
        super().__init__()
        layers: list[nn.Module] = []
        previous = 1
        for c in channels:
            layers += [nn.Conv1d(previous, c, kernel, stride=2, padding=kernel // 2), nn.PReLU()]
            previous = c
        self.body = nn.Sequential(*layers)
        self.out_features = channels[-1] * conv_lengths(length, len(channels), kernel)[-1]

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.body(rows.unsqueeze(1)).flatten(1)


class UpConvStack(nn.Module):
    """[rows, in_features] -> [rows, out_length]: a dense layer to channels[-1] x start length, then one
    transposed convolution per channel count (each doubling the length; the last to one channel)."""

    def __init__(self, in_features: int, channels: tuple[int, ...], out_length: int):
        super().__init__()
        reverse = tuple(reversed(channels))
        self.start_channels = reverse[0]
        self.start_length = max(1, math.ceil(out_length / UP_STRIDE ** len(reverse)))
        self.out_length = out_length
        self.dense = nn.Sequential(nn.Linear(in_features, reverse[0] * self.start_length), nn.PReLU())
        layers: list[nn.Module] = []
        for c_in, c_out in zip(reverse, (*reverse[1:], 1), strict=True):
            layers.append(nn.ConvTranspose1d(c_in, c_out, UP_KERNEL, stride=UP_STRIDE, padding=UP_PADDING))
            if c_out != 1:
                layers.append(nn.PReLU())
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dense(x).reshape(x.shape[0], self.start_channels, self.start_length)
        return self.body(h).squeeze(1)[:, : self.out_length]


class Encoder(nn.Module):
    """Rows -> encoded rows in [-1, 1]: the convolutions, then a dense layer and Tanh."""

    def __init__(self, width: int, latent_dim: int, channels: tuple[int, ...], kernel: int):
        super().__init__()
        self.convs = ConvStack(width, channels, kernel)
        self.out = nn.Linear(self.convs.out_features, latent_dim)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.out(self.convs(rows)))


class Decoder(HeadedDecoder):
    """Encoded rows -> rows in [-1, 1] through the output head."""

    def __init__(self, latent_dim: int, channels: tuple[int, ...], width: int, head: str, groups: tuple[Group, ...]):
        super().__init__(UpConvStack(latent_dim, channels, width), width, head, groups)

    def relaxed(self, latents: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        """Rows whose discrete columns are relaxed draws (`uniforms`: one Uniform(0, 1) per encoded column)
        of the levels `sample_encoded` would draw from `forward`'s output: Gumbel-softmax per one-hot
        group (level k with the softmax's probability), a relaxed Bernoulli per binary column, +1 with
        probability (tanh(a) + 1) / 2 = sigmoid(2 a); continuous columns as `forward` gives them."""
        logits = self.body(latents)
        binary = binary_columns(self.head.groups)
        if binary:
            logits = logits.index_copy(-1, torch.tensor(binary), 2.0 * logits[..., binary])
        return apply_head(logits, "gumbel", self.head.groups, uniforms)


class Autoencoder(nn.Module):
    """Rows -> reconstructed rows. The encoder never reads the `predicted` encoded columns (they reach it
    as zeros, the same for every row): the decoder reconstructs them from the other columns alone."""

    def __init__(
        self,
        width: int,
        latent_dim: int,
        channels: tuple[int, ...],
        kernel: int,
        head: str,
        groups: tuple[Group, ...],
        predicted: Sequence[int] = (),
    ):
        super().__init__()
        self.encoder = Encoder(width, latent_dim, channels, kernel)
        self.decoder = Decoder(latent_dim, channels, width, head, groups)
        if any(not 0 <= c < width for c in predicted):
            raise ConfigError(f"the predicted columns must lie within the encoded width {width}, got {list(predicted)}")
        visible = torch.ones(width)
        visible[list(predicted)] = 0.0
        # Not a weight and not saved: rebuilt from the trainer's arguments.
        self.visible: torch.Tensor
        self.register_buffer("visible", visible, persistent=False)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.decoder(self.encoder(rows * self.visible))
        return out


class Generator(nn.Module):
    """z -> encoded rows in [-1, 1] (the encoder's range). Trained without privacy: it reads no data."""

    def __init__(self, z_dim: int, channels: tuple[int, ...], latent_dim: int):
        super().__init__()
        self.z_dim = z_dim
        self.body = UpConvStack(z_dim, channels, latent_dim)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.body(z))


class Critic(nn.Module):
    """Rows -> one WGAN score per row: the convolutions, then a dense layer of size 1 (no activation)."""

    def __init__(self, width: int, channels: tuple[int, ...], kernel: int):
        super().__init__()
        self.convs = ConvStack(width, channels, kernel)
        self.out = nn.Linear(self.convs.out_features, 1)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.out(self.convs(rows)).squeeze(-1)


def init_from_(module: nn.Module, rng: torch.Generator) -> None:
    """Every dense and convolutional weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's
    default bound) drawn from `rng`, so that the seed fixes the initial networks; PReLU keeps its 0.25."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)):
                fan_in, _ = nn.init._calculate_fan_in_and_fan_out(m.weight)
                bound = 1.0 / math.sqrt(fan_in)
                for p in (m.weight, m.bias):
                    if p is not None:
                        p.copy_((torch.rand(p.shape, generator=rng) * 2 - 1) * bound)


@dataclass(frozen=True)
class ReleaseSpec(LatentReleaseSpec):
    """Everything needed to rebuild the released decoder and generator, stored beside their weights: the
    shared fields (width, latent_dim, z_dim), then RDP-CGAN's."""

    channels: tuple[int, ...]
    head: str
    groups: tuple[Group, ...]
    level_decoding: str

    def build(self) -> tuple[Decoder, Generator]:
        return (
            Decoder(self.latent_dim, self.channels, self.width, self.head, self.groups),
            Generator(self.z_dim, self.channels, self.latent_dim),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReleaseSpec:
        return cls(
            *cls.shared_fields(d),
            tuple(int(c) for c in d["channels"]),
            str(d["head"]),
            tuple((int(a), int(b), str(c)) for a, b, c in d["groups"]),
            str(d["level_decoding"]),
        )
