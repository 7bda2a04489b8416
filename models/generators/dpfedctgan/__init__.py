"""DP-Fed-CTGAN: a CTGAN-style conditional GAN trained by federated averaging (Flower) across sites that
never share rows; each site's discriminator reads its own rows only, through DP-SGD. Its profile section
is `dpfedctgan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration(
    name="dpfedctgan",
    section="dpfedctgan",
    config="dpsynth.models.generators.dpfedctgan.config:DPFedCTGANConfig",
    adapter="dpsynth.models.generators.dpfedctgan.adapter:DPFedCTGAN",
    sampler="dpsynth.models.generators.dpfedctgan.sampler:DPFedCTGANSampler",
    audits="dpsynth.models.generators.dpfedctgan.audit:CALIBRATION_AUDITS",
)
