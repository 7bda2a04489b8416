"""Sampling a DP-Fed-CTGAN generator file: each row's condition (a discrete column drawn uniformly, its
level from the noisy global shares stored in the file), then z and the head's noise, all from the seed.
Imports torch and the networks only (the pyfunc model samples through it)."""

from __future__ import annotations

import numpy as np
import torch

from dpsynth.models.generators.dpfedctgan.networks import ConditionalGenerator, FedGeneratorSpec

BATCH = 8192


class DPFedCTGANSampler:
    """`sample(n_rows, seed)` from a generator file's contents (`blob`)."""

    def __init__(self, blob: dict):
        self.spec = FedGeneratorSpec.from_dict(blob["spec"])
        self.net = self.spec.build()
        self.net.load_state_dict(blob["state_dict"])
        self.net.eval()
        self.shares = torch.as_tensor(blob["condition_shares"], dtype=torch.float32)
        self.width = self.spec.out_width

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        return sample_encoded(self.net, self.spec, self.shares, n_rows, seed)


def sample_encoded(
    gen: ConditionalGenerator, spec: FedGeneratorSpec, shares: torch.Tensor, n_rows: int, seed: int, batch: int = BATCH
) -> np.ndarray:
    rng = torch.Generator().manual_seed(int(seed))
    layout = spec.layout
    parts = []
    with torch.no_grad():
        for start in range(0, n_rows, batch):
            size = min(batch, n_rows - start)
            cond = layout.sampled_conditions(size, shares, rng)
            z, noise = gen.draw_inputs(size, rng)
            parts.append(gen(z, cond, noise).numpy())
    if not parts:
        return np.zeros((0, gen.out_width), dtype=np.float32)
    return np.concatenate(parts)
