"""MST (McKenna, Miklau and Sheldon 2021): noisy 1-way marginals, a spanning tree of column pairs chosen by
the exponential mechanism, their noisy 2-way marginals, and a graphical model estimated from them by
private-pgm (`mbi`), sampled without it. Its profile section is `mst`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration.in_package(__name__, "mst", config="MSTConfig", adapter="MST", sampler="MSTSampler")
