"""Defaults the command line (flows/cli.py) and the Python API (dpsynth/api/) share, so they cannot differ."""

# The profile a release takes when none is named: generic (any schema), whole-release epsilon at most 1,
# minutes on two cores. `default` (GS-WGAN, epsilon 10, about half an hour) was tuned on Cardio and is
# named explicitly where it is meant (the README's main job).
DEFAULT_RELEASE_PROFILE = "eps1"
