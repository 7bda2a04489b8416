"""DP-Fed-CTGAN's networks (CTGAN's shapes, with LayerNorm for BatchNorm so that one row's output and
gradient do not depend on the other rows of its batch, as DP-SGD's per-row clipping needs), and the spec
stored beside a released generator's weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpsynth.models.generators.dpfedctgan.conditions import ConditionLayout
from dpsynth.models.generators.networks import LEAKY_SLOPE, OutputHead, head_noise_width

HEAD = "gumbel"  # CTGAN's: Gumbel-softmax for categorical columns, relaxed Bernoulli for binary ones


class Residual(nn.Module):
    """CTGAN's generator block: [ReLU(LayerNorm(Linear(x))), x]."""

    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.linear, self.norm = nn.Linear(width_in, width_out), nn.LayerNorm(width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(self.norm(self.linear(x))), x], dim=-1)


class ConditionalGenerator(nn.Module):
    """[z, condition] -> residual blocks -> an encoded row through the gumbel head (which also reads one
    Uniform(0, 1) per encoded column)."""

    def __init__(
        self,
        z_dim: int,
        hidden: tuple[int, ...],
        out_width: int,
        groups: tuple[tuple[int, int, str], ...],
        condition_width: int,
    ):
        super().__init__()
        self.z_dim, self.out_width, self.condition_width = z_dim, out_width, condition_width
        self.noise_width = head_noise_width(HEAD, out_width)
        blocks, width = [], z_dim + condition_width
        for h in hidden:
            blocks.append(Residual(width, h))
            width += h
        self.body = nn.Sequential(*blocks, nn.Linear(width, out_width))
        self.head = OutputHead(HEAD, groups)

    def forward(self, z: torch.Tensor, cond: torch.Tensor, head_noise: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(torch.cat([z, cond], -1)), head_noise)

    def draw_inputs(self, n_rows: int, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, head noise) for n_rows rows, drawn from `rng` in that order."""
        return torch.randn(n_rows, self.z_dim, generator=rng), torch.rand(n_rows, self.noise_width, generator=rng)


class ConditionalDiscriminator(nn.Module):
    """[row, condition] -> (Linear, LayerNorm, LeakyReLU 0.2) blocks -> one logit per row."""

    def __init__(self, in_width: int, hidden: tuple[int, ...], condition_width: int):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_width + condition_width
        for h in hidden:
            layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.LeakyReLU(LEAKY_SLOPE)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, rows: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([rows, cond], -1)).squeeze(-1)


@dataclass(frozen=True)
class FedGeneratorSpec:
    """Everything needed to rebuild the generator (and the discriminator while training)."""

    z_dim: int
    hidden: tuple[int, ...]
    out_width: int
    groups: tuple[tuple[int, int, str], ...]

    @property
    def layout(self) -> ConditionLayout:
        return ConditionLayout.from_groups(self.groups)

    def build(self) -> ConditionalGenerator:
        return ConditionalGenerator(self.z_dim, self.hidden, self.out_width, self.groups, self.layout.width)

    def build_discriminator(self, hidden: tuple[int, ...]) -> ConditionalDiscriminator:
        return ConditionalDiscriminator(self.out_width, hidden, self.layout.width)

    def to_dict(self) -> dict:
        return {
            "z_dim": self.z_dim,
            "hidden": list(self.hidden),
            "out_width": self.out_width,
            "groups": [list(g) for g in self.groups],
        }

    @classmethod
    def from_dict(cls, d: dict) -> FedGeneratorSpec:
        return cls(
            int(d["z_dim"]),
            tuple(int(h) for h in d["hidden"]),
            int(d["out_width"]),
            tuple((int(g[0]), int(g[1]), str(g[2])) for g in d["groups"]),
        )
