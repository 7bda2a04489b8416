"""What the two-phase generators' tests (test_dpautogan.py, test_rdpcgan.py) share: the encoded layout of
a small table, a table with structure to learn, and a schedule short enough to train in a test."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def assert_states_equal(a: Any, b: Any, nets: tuple[str, ...]) -> None:
    """Two trainers' networks `nets` hold the same weights, tensor for tensor."""
    for net in nets:
        sa, sb = getattr(a, net).state_dict(), getattr(b, net).state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), f"{net}.{k} differs"


def assert_resume_equals_uninterrupted(
    make_trainer: Callable[..., Any], config: Any, secret: Any, tmp_path: Path, stop_after: int, nets: tuple[str, ...]
) -> None:
    """A run cut after `stop_after` steps (6: then one more step lost with the interruption) and resumed
    from its last checkpoint ends as the uninterrupted run does: steps, ledger, weights, checkpoints.
    `config` has five autoencoder and four generator steps: checkpoints at 0, 2, 4, 5, 6, 8, 9."""
    data = toy_table(60)
    whole = make_trainer(data, config, 5, secret, tmp_path / "whole")
    whole_result = whole.run()
    first = make_trainer(data, config, 5, secret, tmp_path / "cut")
    first.run(stop_after=stop_after)  # 3: between the checkpoints at 2 and 4; 6 then 1 more: past 6
    if stop_after == 6:
        first.step()  # a GAN step after the last checkpoint, lost in the interruption
    resumed = make_trainer(data, config, 5, secret, tmp_path / "cut")
    result = resumed.run()
    assert resumed.step_index == 9 and resumed.accountant.phases == whole.accountant.phases
    assert_states_equal(whole, resumed, nets)
    assert [(e["step"], e["epsilon"], e["sha256"]) for e in result.checkpoints] == [
        (e["step"], e["epsilon"], e["sha256"]) for e in whole_result.checkpoints
    ]
