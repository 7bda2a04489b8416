"""What MST (models/generators/mst) and AIM (models/generators/aim) share: both measure marginals of the
table with the Gaussian mechanism and choose what to measure with the exponential mechanism, under a
zCDP budget (mechanisms.py, audited by audit.py), estimate a graphical model from the noisy measurements
with private-pgm (jax_runtime.py) and release its junction tree's clique marginals (model.py, sampled by
sampler.py) behind the same generator interface (zcdp_adapter.py). Neither imports the other."""
