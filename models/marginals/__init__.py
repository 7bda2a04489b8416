"""Measured marginals: noisy counts of the training rows over public cells (a Gaussian mechanism whose
cost every accountant adds to training's), and the calibration of sampled rows to them (post-processing)."""
