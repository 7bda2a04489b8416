"""RDP-CGAN: a DP-SGD 1-D convolutional autoencoder, then a 1-D convolutional WGAN whose DP-SGD critic reads
the decoder's output. Its profile section is `rdpcgan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration.in_package(
    __name__, "rdpcgan", config="RDPCGANConfig", adapter="RDPCGAN", sampler="RDPCGANSampler"
)
