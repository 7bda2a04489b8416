"""Sampling a DP-auto-GAN release file: z ~ N(0, I) from the seed -> the latent model -> the decoder, the
discrete columns then decoded as the file says (models/generators/two_phase/sampling.py, shared with
RDP-CGAN). Imports torch and the networks only (the pyfunc model samples through it)."""

from __future__ import annotations

from dpsynth.models.generators.dpautogan.networks import ReleaseSpec
from dpsynth.models.generators.two_phase.sampling import TwoPhaseSampler, draw_levels, sample_encoded

__all__ = ["DPAutoGANSampler", "draw_levels", "load_release", "sample_encoded"]


class DPAutoGANSampler(TwoPhaseSampler):
    """`sample(n_rows, seed)` from a release file's contents (`blob`): the training code's sampling."""

    spec_type = ReleaseSpec


# A released checkpoint's decoder and latent model (generator or Gaussian), checked against its SHA-256
# (the ledger's, else the sidecar's).
load_release = DPAutoGANSampler.load_release
