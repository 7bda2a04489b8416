"""The generator GS-WGAN releases, as files: the spec that rebuilds it beside its weights, its condition on
the target, loading a checkpoint and sampling encoded rows from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth.models.checkpoint_files import load_verified
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.networks import Generator, HeadGroup


@dataclass(frozen=True)
class GeneratorSpec:
    """Everything needed to rebuild a generator for sampling, stored beside its weights."""

    z_dim: int
    hidden: tuple[int, ...]
    out_width: int
    head: str
    groups: tuple[HeadGroup, ...]
    # (target column, probability of its second level) for a generator conditioned on the target.
    condition: tuple[int, float] | None = None

    def build(self) -> Generator:
        return Generator(self.z_dim, self.hidden, self.out_width, self.head, list(self.groups), self.condition)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GeneratorSpec:
        condition = d.get("condition")
        return cls(
            d["z_dim"],
            tuple(d["hidden"]),
            d["out_width"],
            d["head"],
            tuple(tuple(g) for g in d["groups"]),
            (int(condition[0]), float(condition[1])) if condition is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "z_dim": self.z_dim,
            "hidden": list(self.hidden),
            "out_width": self.out_width,
            "head": self.head,
            "groups": [list(g) for g in self.groups],
            "condition": list(self.condition) if self.condition is not None else None,
        }


def generator_spec(
    gan: GanConfig, out_width: int, groups: Sequence[HeadGroup], condition: tuple[int, float] | None = None
) -> GeneratorSpec:
    """The spec of the generator the section `gan` trains, for rows `out_width` encoded columns wide."""
    return GeneratorSpec(gan.z_dim, tuple(gan.generator_hidden), out_width, gan.output_head, tuple(groups), condition)


def target_condition(gan: GanConfig, target_index: int, target_kind: str) -> tuple[int, float] | None:
    """The generator's condition for `gan.condition_on_target`: the target's encoded column and the
    public share of its second level (`gan.target_prior`). Only a binary target (one encoded column)
    can be a condition."""
    if not gan.condition_on_target:
        return None
    if target_kind != "binary":
        raise ConfigError(f"gan.condition_on_target needs a binary target column, not a {target_kind} one.")
    return (int(target_index), float(gan.target_prior))


def load_generator(
    path: str | Path, device: str | torch.device = "cpu", sha256: str | None = None
) -> tuple[Generator, dict[str, Any]]:
    """A generator checkpoint; with `sha256` (the training ledger's), only if the file still matches it."""
    if sha256 is not None:
        blob = load_verified(Path(path), sha256, map_location=device, weights_only=False)
    else:
        blob = torch.load(path, map_location=device, weights_only=False)
    gen = GeneratorSpec.from_dict(blob["spec"]).build()
    gen.load_state_dict(blob["state_dict"])
    gen.eval()
    return gen, blob


def sample_encoded(gen: Generator, n_rows: int, seed: int, batch: int = 8192) -> np.ndarray:
    """n rows of generator output (encoded width), from z ~ N(0, I) fixed by the seed."""
    rng = torch.Generator().manual_seed(seed)
    was_training = gen.training
    gen.eval()
    device = next(gen.parameters()).device
    parts: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, n_rows, batch):
            z = gen.latent(min(batch, n_rows - start), rng).to(device)
            parts.append(gen(z).cpu().numpy())
    gen.train(was_training)
    if not parts:
        return np.zeros((0, gen.out_width), dtype=np.float32)
    return np.concatenate(parts)
