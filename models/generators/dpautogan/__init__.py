"""DP-auto-GAN: a DP-SGD autoencoder, then a WGAN (or one Gaussian fit) in its latent space. Its profile
section is `dpautogan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration(
    name="dpautogan",
    section="dpautogan",
    config="dpsynth.models.generators.dpautogan.config:DPAutoGANConfig",
    adapter="dpsynth.models.generators.dpautogan.adapter:DPAutoGAN",
    sampler="dpsynth.models.generators.dpautogan.sampler:DPAutoGANSampler",
    audits="dpsynth.models.generators.dpautogan.audit:CALIBRATION_AUDITS",
)
