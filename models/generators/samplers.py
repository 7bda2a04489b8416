"""Samplers: a generator checkpoint file turned into `sample(n_rows, seed) -> encoded rows`.

One module for every generator type, importing only torch, numpy and the network definitions (no
accountant, Opacus or autodp), because the pyfunc model (models/pyfunc.py) samples through it in a
fresh environment. The released file says which generator wrote it (`"generator_type"`; files without it are
GS-WGAN's, as every release before there was more than one generator), and the same (file, n_rows,
seed) gives the same rows through the training code's sampling and through this module.
The type is under "generator_type" (a DP-auto-GAN file's "generator" holds its generator's weights).
A file that carries measured marginals (under "marginals", public: noisy counts and their plan) samples
through `sample_rows`, which calibrates the generator's rows to them (models/marginals/calibration.py, no
accountant either); a file without them samples as it always did.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dpsynth.models.checkpoint_files import load_verified

BATCH = 8192


class GSWGANSampler:
    def __init__(self, blob: dict):
        from dpsynth.models.generators.networks import Generator

        spec = blob["spec"]
        condition = spec.get("condition")
        self.net = Generator(int(spec["z_dim"]), tuple(spec["hidden"]), int(spec["out_width"]), spec["head"],
                             [tuple(g) for g in spec["groups"]],
                             (int(condition[0]), float(condition[1])) if condition is not None else None)
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


class DPCGANSampler:
    def __init__(self, blob: dict):
        from dpsynth.models.generators.dpcgan.trainer import CGANGeneratorSpec

        self.spec = CGANGeneratorSpec.from_dict(blob["spec"])
        self.net = self.spec.build()
        self.net.load_state_dict(blob["state_dict"])
        self.net.eval()
        self.width = self.spec.out_width

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        from dpsynth.models.generators.dpcgan.trainer import sample_encoded

        # Labels from the public prior, as in training (the paper's p_l).
        return sample_encoded(self.net, n_rows, seed, label_prior=self.spec.label_prior, batch=BATCH)


class DPAutoGANSampler:
    def __init__(self, blob: dict):
        from dpsynth.models.generators.dpautogan.trainer import ReleaseSpec

        spec = ReleaseSpec.from_dict(blob["spec"])
        self.decoder, self.generator = spec.build()
        self.decoder.load_state_dict(blob["decoder"])
        self.generator.load_state_dict(blob["generator"])
        self.decoder.eval()
        self.generator.eval()
        self.width = spec.width
        self.level_decoding = spec.level_decoding

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        from dpsynth.models.generators.dpautogan.trainer import sample_encoded

        return sample_encoded(self.decoder, self.generator, n_rows, seed, batch=BATCH,
                              level_decoding=self.level_decoding)


SAMPLERS = {"gswgan": GSWGANSampler, "dpcgan": DPCGANSampler, "dpautogan": DPAutoGANSampler}


# Key of a generator file's measured marginals: {"measured": MeasuredMarginals.to_dict(), "oversample": k}.
MARGINALS_KEY = "marginals"
# The calibration's random generator is seeded from the request's seed and this, so that it draws apart
# from the generator's own latents (seeded by the seed alone).
CALIBRATION_STREAM = 0xCA11B


def sampler_from_blob(blob: dict, kind: str | None = None):
    """`kind`: the generator type when the caller knows it (a training checkpoint does not record it).
    The sampler carries the file's measured marginals (or None) as `marginals` and `oversample`."""
    kind = kind or blob.get("generator_type", "gswgan")
    if kind not in SAMPLERS:
        raise ValueError(f"generator file written by an unknown generator {kind!r}")
    sampler = SAMPLERS[kind](blob)
    sampler.marginals, sampler.oversample = _measured(blob.get(MARGINALS_KEY))
    return sampler


def _measured(raw: dict | None):
    if raw is None:
        return None, 1
    from dpsynth.models.marginals.measure import MeasuredMarginals

    return MeasuredMarginals.from_dict(raw["measured"]), int(raw["oversample"])


def sample_rows(sampler, encoder, n_rows: int, seed: int):
    """n rows decoded to the schema: the generator's own, or, when its file carries measured marginals,
    `oversample` x n of them calibrated down to n (models/marginals/calibration.py: post-processing of the generator
    and the noisy marginals, with its own random generator seeded from `seed`). The one sampling path of
    the bundle, the pyfunc model, the selection and the report, so all give the same rows for a seed."""
    measured = getattr(sampler, "marginals", None)
    if measured is None or n_rows == 0:
        return encoder.decode(sampler.sample(n_rows, seed))
    from dpsynth.models.marginals.calibration import calibrate

    drawn = encoder.decode(sampler.sample(sampler.oversample * n_rows, seed))
    rng = np.random.default_rng([int(seed), CALIBRATION_STREAM])
    return calibrate(drawn, encoder.schema, measured, rng, rows=n_rows)


def read_generator_file(path: str | Path, sha256: str | None = None) -> dict:
    """The file's contents; with `sha256` (a ledger's), only if the file still matches it."""
    if sha256 is not None:
        return load_verified(Path(path), sha256, map_location="cpu", weights_only=False)
    return torch.load(path, map_location="cpu", weights_only=True)


def load_sampler(path: str | Path, sha256: str | None = None, kind: str | None = None):
    return sampler_from_blob(read_generator_file(path, sha256), kind)
