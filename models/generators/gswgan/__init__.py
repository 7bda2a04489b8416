"""GS-WGAN (the thesis' generator): K critics pretrained on disjoint secret subsets, the generator trained
through the sanitised gradients of the critics its rows query. Its profile section is `gan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration.in_package(
    __name__, "gswgan", config="GanConfig", adapter="GSWGAN", sampler="GSWGANSampler", section="gan"
)
