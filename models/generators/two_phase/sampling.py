"""Sampling a two-phase release: z ~ N(0, I) from the seed -> the latent model -> the decoder, the
discrete columns then decoded as the file says. Post-processing of the released networks: no privacy
cost. Imports torch, numpy and the shared networks only (the pyfunc model samples through it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from dpsynth.models.checkpoint_files import load_verified
from dpsynth.models.generators.networks import binary_columns, one_hot_groups
from dpsynth.models.generators.two_phase.networks import check_level_decoding

BATCH = 8192


class TwoPhaseSampler:
    """`sample(n_rows, seed)` from a release file's contents (`blob`): the training code's sampling.
    A generator's sampler names its release spec (`spec_type`, with `from_dict`)."""

    spec_type: ClassVar[Any]

    def __init__(self, blob: dict[str, Any]):
        spec = self.spec_type.from_dict(blob["spec"])
        self.decoder, self.generator = spec.build()
        self.decoder.load_state_dict(blob["decoder"])
        self.generator.load_state_dict(blob["generator"])
        self.decoder.eval()
        self.generator.eval()
        self.width = spec.width  # the encoded width (the pyfunc model checks it against the schema's)
        self.level_decoding = spec.level_decoding

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        return sample_encoded(self.decoder, self.generator, n_rows, seed, self.level_decoding)

    @classmethod
    def load_release(cls, path: str | Path, sha256: str | None = None) -> tuple[Any, Any, dict[str, Any]]:
        """A released checkpoint's decoder and latent model, checked against its SHA-256 (the ledger's,
        else the sidecar's)."""
        blob = load_verified(Path(path), sha256, map_location="cpu", weights_only=False)
        sampler = cls(blob)
        return sampler.decoder, sampler.generator, blob


def sample_encoded(
    decoder: Any,
    generator: Any,
    n_rows: int,
    seed: int,
    level_decoding: str = "argmax",
    batch: int = BATCH,
) -> np.ndarray:
    """n encoded rows in [-1, 1]: z ~ N(0, I) from `seed` -> generator -> decoder; with `level_decoding`
    "sample", each discrete column then gets a level drawn from the decoder's probabilities (uniforms
    from the same stream, after each batch's z; see `draw_levels`)."""
    check_level_decoding(level_decoding, decoder.head.kind)
    rng = torch.Generator().manual_seed(int(seed))
    drawing = level_decoding == "sample"
    groups = one_hot_groups(decoder.head.groups) if drawing else []
    binary = binary_columns(decoder.head.groups) if drawing else []
    parts = []
    with torch.no_grad():
        for start in range(0, n_rows, batch):
            z = torch.randn(min(batch, n_rows - start), generator.z_dim, generator=rng)
            rows = decoder(generator(z))
            if groups or binary:
                uniforms = torch.rand(rows.shape[0], len(groups) + len(binary), generator=rng)
                rows = draw_levels(rows, groups, binary, uniforms)
            parts.append(rows.numpy())
    return np.concatenate(parts) if parts else np.zeros((0, decoder.width), dtype=np.float32)


def draw_levels(
    rows: torch.Tensor, groups: list[tuple[int, int]], binary: list[int], uniforms: torch.Tensor
) -> torch.Tensor:
    """Rows whose discrete columns are replaced by +-1 draws from the decoder's probabilities, one uniform
    per row and column (the groups' first, then the binary columns'). A one-hot group (a softmax mapped
    to [-1, 1]) gets level k where its cumulative probability first exceeds the uniform; a binary column
    x (trained by cross entropy on (x + 1) / 2) is +1 with probability (x + 1) / 2."""
    out = rows.clone()
    for g, (start, stop) in enumerate(groups):
        cumulative = torch.cumsum((rows[:, start:stop] + 1.0) * 0.5, dim=1)
        # Scaled by the row's total so rounding never leaves a uniform above the last level's sum.
        threshold = uniforms[:, g : g + 1] * cumulative[:, -1:]
        level = (cumulative <= threshold).sum(dim=1).clamp(max=stop - start - 1)
        block = torch.full_like(rows[:, start:stop], -1.0)
        block[torch.arange(rows.shape[0]), level] = 1.0
        out[:, start:stop] = block
    for b, column in enumerate(binary):
        positive = uniforms[:, len(groups) + b] < (rows[:, column] + 1.0) * 0.5
        out[:, column] = torch.where(positive, 1.0, -1.0)
    return out
