"""AIM (McKenna, Mullins, Sheldon and Miklau 2022): every 1-way marginal measured, then rounds that each
choose the workload marginal the current model gets most wrong (the exponential mechanism), measure it
(the Gaussian mechanism) and re-estimate a graphical model with private-pgm (`mbi`), until the zCDP
budget is spent. The released model is MST's junction-tree model, sampled without `mbi`. Its profile
section is `aim`."""

from dpsynth.models.generator_registry import Registration

GENERATOR = Registration.in_package(__name__, "aim", config="AIMConfig", adapter="AIM", sampler="AIMSampler")
