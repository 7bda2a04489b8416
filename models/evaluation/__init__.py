"""What a synthetic table is worth: the logistic-regression model selection over every checkpoint, the
experiment's checkpoint choice, sample quality and fidelity scores, and membership inference."""
