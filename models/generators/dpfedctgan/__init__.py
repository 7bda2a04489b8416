"""DP-Fed-CTGAN: a CTGAN-style conditional GAN trained by federated averaging (Flower) across sites that
never share rows; each site's discriminator reads its own rows only, through DP-SGD. Its profile section
is `dpfedctgan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration.in_package(
    __name__, "dpfedctgan", config="DPFedCTGANConfig", adapter="DPFedCTGAN", sampler="DPFedCTGANSampler"
)
