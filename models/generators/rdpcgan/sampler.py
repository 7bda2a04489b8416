"""Sampling an RDP-CGAN release file: z ~ N(0, I) from the seed -> the generator -> the decoder, the
discrete columns then decoded as the file says. Imports torch, numpy and the networks only (the pyfunc
model samples through it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth.models.checkpoint_files import load_verified
from dpsynth.models.generators.dpautogan.sampler import draw_levels
from dpsynth.models.generators.networks import binary_columns, one_hot_groups
from dpsynth.models.generators.rdpcgan.networks import Decoder, Generator, ReleaseSpec, check_level_decoding

BATCH = 8192


class RDPCGANSampler:
    """`sample(n_rows, seed)` from a release file's contents (`blob`): the training code's sampling."""

    def __init__(self, blob: dict[str, Any]):
        spec = ReleaseSpec.from_dict(blob["spec"])
        self.decoder, self.generator = spec.build()
        self.decoder.load_state_dict(blob["decoder"])
        self.generator.load_state_dict(blob["generator"])
        self.decoder.eval()
        self.generator.eval()
        self.width = spec.width  # the encoded width (the pyfunc model checks it against the schema's)
        self.level_decoding = spec.level_decoding

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        return sample_encoded(self.decoder, self.generator, n_rows, seed, self.level_decoding)


def load_release(path: str | Path, sha256: str | None = None) -> tuple[Decoder, Generator, dict[str, Any]]:
    """A released checkpoint's decoder and generator, checked against its SHA-256 (ledger's, else sidecar's)."""
    blob = load_verified(Path(path), sha256, map_location="cpu", weights_only=False)
    sampler = RDPCGANSampler(blob)
    return sampler.decoder, sampler.generator, blob


def sample_encoded(
    decoder: Decoder, generator: Generator, n_rows: int, seed: int, level_decoding: str, batch: int = BATCH
) -> np.ndarray:
    """n encoded rows in [-1, 1]: z ~ N(0, I) from `seed` -> generator -> decoder; with `level_decoding`
    "sample", each discrete column then gets a level drawn from the decoder's probabilities (uniforms
    from the same stream, after each batch's z; DP-auto-GAN's `draw_levels`)."""
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
