"""RDP-CGAN: a DP-SGD 1-D convolutional autoencoder, then a 1-D convolutional WGAN whose DP-SGD critic reads
the decoder's output. Its profile section is `rdpcgan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration(
    name="rdpcgan",
    section="rdpcgan",
    config="dpsynth.models.generators.rdpcgan.config:RDPCGANConfig",
    adapter="dpsynth.models.generators.rdpcgan.adapter:RDPCGAN",
    sampler="dpsynth.models.generators.rdpcgan.sampler:RDPCGANSampler",
    audits="dpsynth.models.generators.rdpcgan.audit:CALIBRATION_AUDITS",
)
