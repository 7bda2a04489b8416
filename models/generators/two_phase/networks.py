"""The networks' pieces both two-phase generators share: the encoding's blocks, the decoder's output head
(GS-WGAN's `OutputHead`, models/generators/networks.py: "typed" is Tanh per single column and a softmax
per one-hot group mapped to [-1, 1], so decoded categorical groups are valid distributions) and how a
release decodes levels. Each generator's networks.py builds the bodies (fully connected for DP-auto-GAN,
1-D convolutions for RDP-CGAN)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.networks import OutputHead

Group = tuple[int, int, str]
HEADS = ("tanh", "typed")
# How a sampled row's discrete columns become levels: the decoder's most likely level, or a level drawn
# from the decoder's probabilities. Argmax loses every level that is never the most likely one for any
# latent (rare levels of a wide column); drawing keeps each level at the share the decoder gives it.
LEVEL_DECODINGS = ("argmax", "sample")


@dataclass(frozen=True)
class LatentReleaseSpec:
    """The fields every two-phase release stores first to rebuild its decoder and latent model: the encoded
    width, the latent width and the noise width. Each generator's ReleaseSpec adds its own after them (a
    dataclass lists its base class's fields first), so the stored order, written into the release files,
    is these three, then the generator's."""

    width: int
    latent_dim: int
    z_dim: int

    def to_dict(self) -> dict[str, Any]:
        """The stored form: the fields in their order, every tuple (nested ones too) a list."""
        return {key: _as_lists(value) for key, value in asdict(self).items()}

    @staticmethod
    def shared_fields(d: Mapping[str, Any]) -> tuple[int, int, int]:
        """width, latent_dim and z_dim of a stored spec (`to_dict`'s form), for a ReleaseSpec's from_dict."""
        return int(d["width"]), int(d["latent_dim"]), int(d["z_dim"])


def _as_lists(value: Any) -> Any:
    return [_as_lists(item) for item in value] if isinstance(value, tuple) else value


def check_groups(groups: Sequence[Sequence[Any]], width: int) -> tuple[Group, ...]:
    """The encoder's (start, stop, kind) blocks, checked to lie within the encoded width."""
    checked = tuple((int(g[0]), int(g[1]), str(g[2]) if len(g) > 2 else "") for g in groups)
    if any(not 0 <= a < b <= width for a, b, _ in checked):
        raise ConfigError(f"the encoding's blocks must lie within the encoded width {width}, got {checked}")
    return checked


def check_level_decoding(level_decoding: str, head: str) -> None:
    if level_decoding not in LEVEL_DECODINGS:
        raise ConfigError(f"level_decoding must be one of {', '.join(LEVEL_DECODINGS)}, got {level_decoding!r}")
    if level_decoding == "sample" and head != "typed":
        raise ConfigError(
            "level_decoding: sample needs head: typed (its softmax gives each one-hot group's level probabilities)"
        )


class HeadedDecoder(nn.Module):
    """Latents -> encoded rows in [-1, 1]: a generator's `body`, then the output head."""

    def __init__(self, body: nn.Module, width: int, head: str, groups: Sequence[Sequence[Any]]):
        super().__init__()
        if head not in HEADS:
            raise ConfigError(f"the decoder's head must be one of {', '.join(HEADS)}, got {head!r}")
        self.width = width
        self.body = body
        self.head = OutputHead(head, check_groups(groups, width))

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.body(latents))
        return out
