"""What the two-phase generators' tests (test_dpautogan.py, test_rdpcgan.py) share: the encoded layout of
a small table, a table with structure to learn, and a schedule short enough to train in a test."""

import torch

# Encoded layout: a continuous column, a binary column, a 3-level categorical.
GROUPS = [(0, 1, "continuous"), (1, 2, "binary"), (2, 5, "categorical")]
WIDTH = 5
DELTA = 1e-5

# Both phases' DP-SGD and the schedule: four autoencoder steps, then three generator steps.
SMALL_SCHEDULE = {
    "autoencoder_rate": 0.25,
    "autoencoder_clip": 1.0,
    "autoencoder_noise": 1.0,
    "autoencoder_steps": 4,
    "critic_rate": 0.2,
    "critic_clip": 0.5,
    "critic_noise": 1.5,
    "critic_steps": 2,
    "generator_steps": 3,
    "generator_batch": 8,
    "checkpoint_every": 2,
}


def toy_table(n: int, seed: int = 0) -> torch.Tensor:
    """Rows in [-1, 1] with structure to learn: the binary column's sign drives the continuous value
    (about +-0.6) and the categorical level (0 or 2)."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.5).float() * 2 - 1
    x = (0.6 * y + 0.1 * torch.randn(n, generator=g)).clamp(-1, 1)
    cat = -torch.ones(n, 3)
    cat[torch.arange(n), torch.where(y > 0, 0, 2)] = 1.0
    return torch.cat([x[:, None], y[:, None], cat], 1)


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads.values()])
