"""MST (McKenna, Miklau and Sheldon 2021): noisy 1-way marginals, a spanning tree of column pairs chosen by
the exponential mechanism, their noisy 2-way marginals, and a graphical model estimated from them by
private-pgm (`mbi`), sampled without it. Its profile section is `mst`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration(
    name="mst",
    section="mst",
    config="dpsynth.models.generators.mst.config:MSTConfig",
    adapter="dpsynth.models.generators.mst.adapter:MST",
    sampler="dpsynth.models.generators.mst.sampler:MSTSampler",
    audits="dpsynth.models.generators.mst.audit:CALIBRATION_AUDITS",
)
