"""DP-auto-GAN: a DP-SGD autoencoder, then a WGAN (or one Gaussian fit) in its latent space. Its profile
section is `dpautogan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration.in_package(
    __name__, "dpautogan", config="DPAutoGANConfig", adapter="DPAutoGAN", sampler="DPAutoGANSampler"
)
