"""DP-CGAN: a conditional GAN whose discriminator alone reads rows, through DP-SGD. Its profile section
is `dpcgan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration.in_package(
    __name__, "dpcgan", config="DPCGANConfig", adapter="DPCGAN", sampler="DPCGANSampler"
)
