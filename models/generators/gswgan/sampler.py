"""Sampling a GS-WGAN generator file: z (and the target's label, for a conditional generator) from the
seed, through the released generator. Imports torch and the networks only (the pyfunc model samples
through it)."""

from __future__ import annotations

import numpy as np
import torch

from dpsynth.models.generators.networks import Generator

BATCH = 8192


class GSWGANSampler:
    """`sample(n_rows, seed)` from a generator file's contents (`blob`): the training code's sampling."""

    def __init__(self, blob: dict):
        spec = blob["spec"]
        condition = spec.get("condition")
        self.net = Generator(
            int(spec["z_dim"]),
            tuple(spec["hidden"]),
            int(spec["out_width"]),
            spec["head"],
            [tuple(g) for g in spec["groups"]],
            (int(condition[0]), float(condition[1])) if condition is not None else None,
        )
        self.net.load_state_dict(blob["state_dict"])
        self.net.eval()
        self.width = int(spec["out_width"])

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        rng = torch.Generator().manual_seed(int(seed))
        parts = []
        with torch.no_grad():
            for start in range(0, n_rows, BATCH):
                parts.append(self.net(self.net.latent(min(BATCH, n_rows - start), rng)).numpy())
        return np.concatenate(parts) if parts else np.zeros((0, self.width), dtype=np.float32)

    def conditions_on_target(self) -> bool:
        """A conditional generator (trained with a `condition`) takes the target's label in its latent."""
        return self.net.condition is not None

    def sample_with_label(self, n_rows: int, seed: int, label: int) -> np.ndarray:
        """`sample`'s rows with the label's place in the latent set to `label` (networks.draw_latent)."""
        net = self.net
        rng = torch.Generator().manual_seed(int(seed))
        parts = []
        with torch.no_grad():
            for start in range(0, n_rows, BATCH):
                latent = net.latent(min(BATCH, n_rows - start), rng)
                latent[:, net.z_dim] = 2.0 * label - 1.0
                parts.append(net(latent).numpy())
        return np.concatenate(parts) if parts else np.zeros((0, self.width), dtype=np.float32)
