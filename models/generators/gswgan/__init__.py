"""GS-WGAN (the thesis' generator): K critics pretrained on disjoint secret subsets, the generator trained
through the sanitised gradients of the critics its rows query. Its profile section is `gan`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration(
    name="gswgan",
    section="gan",
    config="dpsynth.models.generators.gswgan.config:GanConfig",
    adapter="dpsynth.models.generators.gswgan.adapter:GSWGAN",
    sampler="dpsynth.models.generators.gswgan.sampler:GSWGANSampler",
    audits="dpsynth.models.generators.gswgan.audit:CALIBRATION_AUDITS",
)
