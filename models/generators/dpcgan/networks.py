"""DP-CGAN's networks: the conditional generator and discriminator, and the spec stored beside a
released generator's weights (enough to rebuild it for sampling)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.networks import LEAKY_SLOPE, OutputHead, head_noise_width

HEADS = ("tanh", "typed", "gumbel")
LABELS = 2  # binary target: label 0 (encoded -1) and label 1 (encoded +1)


def one_hot_labels(labels: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # A comparison, not F.one_hot: one_hot checks its input's range, which vmap cannot trace.
    return (labels.long().unsqueeze(-1) == torch.arange(LABELS, device=labels.device)).to(dtype)


def check_groups(groups, out_width: int, target_index: int) -> list[tuple[int, int, str]]:
    """The encoder's (start, stop, kind) blocks; the target must be one of them, binary."""
    checked = [(int(g[0]), int(g[1]), str(g[2])) for g in groups]
    if not any(g == (target_index, target_index + 1, "binary") for g in checked):
        raise ConfigError(
            f"encoded column {target_index} is not a binary block of the encoding: DP-CGAN "
            "conditions on a binary target column"
        )
    if checked and max(g[1] for g in checked) > out_width:
        raise ConfigError(f"the encoding's blocks reach past the encoded width {out_width}")
    return checked


class ConditionalGenerator(nn.Module):
    """[z, one-hot label] -> hidden layers -> an encoded row, the label written into the target column.

    The "gumbel" head also reads one Uniform(0, 1) per encoded column (`head_noise`)."""

    def __init__(self, z_dim: int, hidden: tuple[int, ...], out_width: int, head: str, groups, target_index: int):
        super().__init__()
        if head not in HEADS:
            raise ConfigError(f"the output head must be one of {', '.join(HEADS)}, got {head!r}")
        self.z_dim, self.out_width, self.target_index = z_dim, out_width, int(target_index)
        self.noise_width = head_noise_width(head, out_width)
        layers, width = [], z_dim + LABELS
        for h in hidden:
            # LayerNorm, not BatchNorm: a row's output then does not depend on the batch it is sampled
            # in, and training and sampling compute the same function.
            layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, out_width))
        self.body = nn.Sequential(*layers)
        self.head = OutputHead(head, check_groups(groups, out_width, target_index))

    def forward(self, z: torch.Tensor, labels: torch.Tensor, head_noise: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.body(torch.cat([z, one_hot_labels(labels, z.dtype)], -1))
        out = self.head(logits, head_noise)
        # The label is an input, not generated: copied in, so no gradient reaches the target's logit.
        column = torch.zeros(out.shape[-1], dtype=torch.bool, device=out.device)
        column[self.target_index] = True
        return torch.where(column, (2.0 * labels.to(out.dtype) - 1.0).unsqueeze(-1), out)

    def draw_inputs(self, n_rows: int, labels: torch.Tensor, rng: torch.Generator):
        """(z, head noise or None) for n_rows rows, drawn from `rng` in that order."""
        z = torch.randn(n_rows, self.z_dim, generator=rng)
        noise = torch.rand(n_rows, self.noise_width, generator=rng) if self.noise_width else None
        return z, noise


class ConditionalDiscriminator(nn.Module):
    """[row, one-hot label] -> hidden layers (LayerNorm, LeakyReLU 0.2) -> one logit per row."""

    def __init__(self, in_width: int, hidden: tuple[int, ...]):
        super().__init__()
        layers, width = [], in_width + LABELS
        for h in hidden:
            layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.LeakyReLU(LEAKY_SLOPE)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([rows, one_hot_labels(labels, rows.dtype)], -1)).squeeze(-1)


@dataclass(frozen=True)
class CGANGeneratorSpec:
    """Everything needed to rebuild the generator for sampling, stored beside its weights."""

    z_dim: int
    hidden: tuple[int, ...]
    out_width: int
    head: str
    groups: tuple[tuple[int, int, str], ...]
    target_index: int
    label_prior: float

    def build(self) -> ConditionalGenerator:
        return ConditionalGenerator(self.z_dim, self.hidden, self.out_width, self.head, self.groups, self.target_index)

    def to_dict(self) -> dict:
        return {
            "z_dim": self.z_dim,
            "hidden": list(self.hidden),
            "out_width": self.out_width,
            "head": self.head,
            "groups": [list(g) for g in self.groups],
            "target_index": self.target_index,
            "label_prior": self.label_prior,
        }

    @classmethod
    def from_dict(cls, d: dict) -> CGANGeneratorSpec:
        return cls(
            int(d["z_dim"]),
            tuple(d["hidden"]),
            int(d["out_width"]),
            d["head"],
            tuple((int(g[0]), int(g[1]), str(g[2])) for g in d["groups"]),
            int(d["target_index"]),
            float(d["label_prior"]),
        )
