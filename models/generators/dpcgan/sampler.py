"""Sampling a DP-CGAN generator file: labels from the public prior (the paper's p_l), then z and the
head's noise from the seed. Imports torch and the networks only (the pyfunc model samples through it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dpsynth.models.checkpoint_files import load_verified
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.dpcgan.networks import CGANGeneratorSpec, ConditionalGenerator

BATCH = 8192


class DPCGANSampler:
    """`sample(n_rows, seed)` from a generator file's contents (`blob`): the training code's sampling."""

    def __init__(self, blob: dict):
        self.spec = CGANGeneratorSpec.from_dict(blob["spec"])
        self.net = self.spec.build()
        self.net.load_state_dict(blob["state_dict"])
        self.net.eval()
        self.width = self.spec.out_width

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        # Labels from the public prior, as in training (the paper's p_l).
        return sample_encoded(self.net, n_rows, seed, label_prior=self.spec.label_prior, batch=BATCH)

    def conditions_on_target(self) -> bool:
        return True  # the label is an input of every DP-CGAN generator

    def sample_with_label(self, n_rows: int, seed: int, label: int) -> np.ndarray:
        return sample_encoded(self.net, n_rows, seed, label=label)


def load_generator(path: str | Path, sha256: str | None = None) -> tuple[ConditionalGenerator, dict]:
    """A generator checkpoint, checked against its SHA-256 (the ledger's, else its sidecar's)."""
    blob = load_verified(Path(path), sha256, map_location="cpu", weights_only=False)
    gen = CGANGeneratorSpec.from_dict(blob["spec"]).build()
    gen.load_state_dict(blob["state_dict"])
    gen.eval()
    return gen, blob


def sample_encoded(
    gen: ConditionalGenerator,
    n_rows: int,
    seed: int,
    label: int | None = None,
    label_prior: float = 0.5,
    batch: int = BATCH,
) -> np.ndarray:
    """n encoded rows: all with `label` (0 or 1), or labels drawn from the public `label_prior`."""
    if label not in (None, 0, 1):
        raise ConfigError(f"a DP-CGAN label is 0 or 1, got {label!r}")
    rng = torch.Generator().manual_seed(int(seed))
    parts = []
    with torch.no_grad():
        for start in range(0, n_rows, batch):
            size = min(batch, n_rows - start)
            if label is None:
                labels = (torch.rand(size, generator=rng) < label_prior).long()
            else:
                labels = torch.full((size,), int(label), dtype=torch.long)
            z, noise = gen.draw_inputs(size, labels, rng)
            parts.append(gen(z, labels, noise).numpy())
    if not parts:
        return np.zeros((0, gen.out_width), dtype=np.float32)
    return np.concatenate(parts)
