"""Samplers: a generator checkpoint file turned into `sample(n_rows, seed) -> encoded rows`.

The one way in for every generator type: reading the file, and the generator's own Sampler (its
package's `sampler.py`, found by name through the registry, models/generators/registry.py), which
imports only torch, numpy and its networks (no accountant, Opacus or autodp), because the pyfunc model
(models/pyfunc.py) samples through this module in a fresh environment. The released file says which
generator wrote it (`"generator_type"`; files without it are the default generator's, GS-WGAN's, as
every release before there was more than one generator), and the same (file, n_rows, seed) gives the
same rows through the training code's sampling and through this module.
The type is under "generator_type" (a DP-auto-GAN file's "generator" holds its generator's weights).
A file that carries measured marginals (under "marginals", public: noisy counts and their plan) samples
through `sample_rows`, which calibrates the generator's rows to them (models/marginals/calibration.py, no
accountant either); a file without them samples as it always did.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from dpsynth.models.checkpoint_files import load_verified
from dpsynth.models.generators.registry import DEFAULT_GENERATOR, names, registration

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.models.marginals.measure import MeasuredMarginals

# Key of a generator file's measured marginals: {"measured": MeasuredMarginals.to_dict(), "oversample": k}.
MARGINALS_KEY = "marginals"
# The calibration's random generator is seeded from the request's seed and this, so that it draws apart
# from the generator's own latents (seeded by the seed alone).
CALIBRATION_STREAM = 0xCA11B


class Sampler(Protocol):
    """A generator package's sampler (its `sampler.py`), built from a generator file's contents, with the
    file's measured marginals attached by `sampler_from_blob`."""

    marginals: MeasuredMarginals | None
    oversample: int

    def sample(self, n_rows: int, seed: int) -> np.ndarray: ...


def sampler_from_blob(blob: dict[str, Any], kind: str | None = None) -> Sampler:
    """`kind`: the generator type when the caller knows it (a training checkpoint does not record it).
    The sampler carries the file's measured marginals (or None) as `marginals` and `oversample`."""
    kind = kind or blob.get("generator_type", DEFAULT_GENERATOR)
    if kind not in names():
        raise ValueError(f"generator file written by an unknown generator {kind!r}")
    sampler = registration(kind).sampler_class()(blob)
    sampler.marginals, sampler.oversample = _measured(blob.get(MARGINALS_KEY))
    return sampler


def _measured(raw: dict[str, Any] | None) -> tuple[MeasuredMarginals | None, int]:
    if raw is None:
        return None, 1
    from dpsynth.models.marginals.measure import MeasuredMarginals

    return MeasuredMarginals.from_dict(raw["measured"]), int(raw["oversample"])


def sample_rows(sampler: Sampler, encoder: TableEncoder, n_rows: int, seed: int) -> pd.DataFrame:
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


def load_sampler(path: str | Path, sha256: str | None = None, kind: str | None = None) -> Sampler:
    return sampler_from_blob(read_generator_file(path, sha256), kind)
