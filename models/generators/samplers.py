"""Samplers: a generator checkpoint file turned into `sample(n_rows, seed) -> encoded rows`.

The one way in for every generator type: reading the file, and the generator's own Sampler (its
package's `sampler.py`, found by name through the registry, models/generator_registry.py), which
imports only torch, numpy and its networks (no accountant, Opacus or autodp), because the pyfunc model
(models/pyfunc.py) samples through this module in a fresh environment. The released file says which
generator wrote it (`"generator_type"`; files without it are the default generator's, GS-WGAN's, as
every release before there was more than one generator), and the same (file, n_rows, seed) gives the
same rows through the training code's sampling and through this module.
The type is under "generator_type" (a DP-auto-GAN file's "generator" holds its generator's weights).
A file that carries measured marginals (under "marginals", public: noisy counts and their plan) samples
through `sample_rows`, which calibrates the generator's rows to them (models/marginals/calibration.py, no
accountant either); a file without them samples as it always did.

A released file records its format (`"format_version"`, `GENERATOR_FORMAT_VERSION`): a reader loads
every file whose version it knows and refuses a newer one with a message saying to upgrade; a file
without it (every release before the key existed, and training checkpoints) is version 1. Change the
version only when a reader of the current code could no longer sample a new file correctly.
Conditioning on the target (`sample_with_label`) is for the generators whose sampler takes the target's
label as an input and says so (`LabelSampler`: a GS-WGAN generator with a `condition`, DP-CGAN); every
other condition is the caller's to draw by rejection from ordinary samples.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from dpsynth.models.checkpoint_files import load_verified
from dpsynth.models.errors import ConfigError
from dpsynth.models.generator_registry import DEFAULT_GENERATOR, names, registration

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.models.marginals.measure import MeasuredMarginals

# Key of a generator file's measured marginals: {"measured": MeasuredMarginals.to_dict(), "oversample": k}.
MARGINALS_KEY = "marginals"
# The calibration's random generator is seeded from the request's seed and this, so that it draws apart
# from the generator's own latents (seeded by the seed alone).
CALIBRATION_STREAM = 0xCA11B
# The format of the released generator file this code writes, and the newest it reads (see above).
FORMAT_VERSION_KEY = "format_version"
GENERATOR_FORMAT_VERSION = 1
# Seeds drawn for a request without one: 63 bits from the OS's CSPRNG (torch seeds take up to 64).
FRESH_SEED_BITS = 63


class Sampler(Protocol):
    """A generator package's sampler (its `sampler.py`), built from a generator file's contents, with the
    file's measured marginals attached by `sampler_from_blob`."""

    marginals: MeasuredMarginals | None
    oversample: int

    def sample(self, n_rows: int, seed: int) -> np.ndarray: ...


class LabelSampler(Sampler, Protocol):
    """A sampler whose generator takes the target's label as an input (a GS-WGAN generator with a
    `condition`, DP-CGAN): it sets the label instead of drawing it from the public prior, everything else
    drawn from the seed as `sample` draws it. The sampler says whether it can, so that a new generator
    conditions without an edit here."""

    def conditions_on_target(self) -> bool: ...

    def sample_with_label(self, n_rows: int, seed: int, label: int) -> np.ndarray: ...


def sampler_from_blob(blob: dict[str, Any], kind: str | None = None) -> Sampler:
    """`kind`: the generator type when the caller knows it (a training checkpoint does not record it).
    The sampler carries the file's measured marginals (or None) as `marginals` and `oversample`."""
    kind = kind or blob.get("generator_type", DEFAULT_GENERATOR)
    if kind not in names():
        raise ValueError(f"generator file written by an unknown generator {kind!r}")
    sampler: Sampler = registration(kind).sampler_class()(blob)
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


def fresh_seed() -> int:
    """A seed from the operating system's randomness, for a request that gives none: fresh rows."""
    return secrets.randbits(FRESH_SEED_BITS)


def read_generator_file(path: str | Path, sha256: str | None = None) -> dict:
    """The file's contents; with `sha256` (a ledger's), only if the file still matches it. A file of a
    newer format than this code reads is refused (`format_version`)."""
    if sha256 is not None:
        blob = load_verified(Path(path), sha256, map_location="cpu", weights_only=False)
    else:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    format_version(blob, str(path))
    return blob


def format_version(blob: dict[str, Any], where: str = "the generator file") -> int:
    """The file's format version (1 when it records none), or ConfigError when this code cannot read it."""
    version = blob.get(FORMAT_VERSION_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"{where} records an invalid format version {version!r}: it was not written by dpsynth.")
    if version > GENERATOR_FORMAT_VERSION:
        raise ConfigError(
            f"{where} is a generator file of format version {version}, newer than this dpsynth reads "
            f"(up to {GENERATOR_FORMAT_VERSION}): upgrade dpsynth to a version that supports it to load it."
        )
    return version


def public_facts(blob: dict[str, Any]) -> dict[str, object]:
    """The file's public facts without its weights: spec, generator type, iteration, epsilon, delta, format."""
    facts = {k: v for k, v in blob.items() if k == "spec" or not isinstance(v, dict)}
    facts.setdefault(FORMAT_VERSION_KEY, 1)
    return facts


def load_sampler(path: str | Path, sha256: str | None = None, kind: str | None = None) -> Sampler:
    return sampler_from_blob(read_generator_file(path, sha256), kind)


def conditions_on_target(sampler: Sampler) -> bool:
    """Whether the sampler's generator takes the target's label as an input (so `sample_with_label` sets it):
    a sampler that can says so itself (`LabelSampler`); any other draws conditions by rejection."""
    says = getattr(sampler, "conditions_on_target", None)
    return bool(says()) if callable(says) else False


def sample_with_label(sampler: Sampler, n_rows: int, seed: int, label: int) -> np.ndarray:
    """n encoded rows whose target is its level `label` (0: the first level, 1: the second), from a
    generator that conditions on the target (its sampler's own `sample_with_label`). The rows are the
    generator's own (no calibration to measured marginals: that would move the target again)."""
    if label not in (0, 1):
        raise ValueError(f"the target's label is 0 or 1, not {label!r}")
    if not conditions_on_target(sampler):
        raise ValueError("this generator does not condition on the target: draw by rejection instead")
    return cast("LabelSampler", sampler).sample_with_label(n_rows, seed, label)
