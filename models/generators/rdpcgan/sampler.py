"""Sampling an RDP-CGAN release file: z ~ N(0, I) from the seed -> the generator -> the decoder, the
discrete columns then decoded as the file says (models/generators/two_phase/sampling.py, shared with
DP-auto-GAN). Imports torch, numpy and the networks only (the pyfunc model samples through it)."""

from __future__ import annotations

from dpsynth.models.generators.rdpcgan.networks import ReleaseSpec
from dpsynth.models.generators.two_phase.sampling import TwoPhaseSampler, sample_encoded

__all__ = ["RDPCGANSampler", "load_release", "sample_encoded"]


class RDPCGANSampler(TwoPhaseSampler):
    """`sample(n_rows, seed)` from a release file's contents (`blob`): the training code's sampling."""

    spec_type = ReleaseSpec


# A released checkpoint's decoder and generator, checked against its SHA-256 (the ledger's, else the sidecar's).
load_release = RDPCGANSampler.load_release
