"""DP-CGAN: a conditional GAN whose discriminator alone reads rows, through DP-SGD. Its profile section
is `dpcgan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration(
    name="dpcgan",
    section="dpcgan",
    config="dpsynth.models.generators.dpcgan.config:DPCGANConfig",
    adapter="dpsynth.models.generators.dpcgan.adapter:DPCGAN",
    sampler="dpsynth.models.generators.dpcgan.sampler:DPCGANSampler",
    audits="dpsynth.models.generators.dpcgan.audit:CALIBRATION_AUDITS",
)
