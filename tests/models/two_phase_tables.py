"""What the two-phase generators' tests (test_dpautogan.py, test_rdpcgan.py) share: the encoded layout of
a small table, a table with structure to learn, and a schedule short enough to train in a test."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dpsynth.models.privacy.dpsgd_accountant import Phase, epsilon

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


def assert_row_gradients(
    module: torch.nn.Module, batched: dict[str, torch.Tensor], row: int, loss: torch.Tensor
) -> None:
    """The per-example gradients `batched` (by parameter name) hold at `row` the gradient of `loss`, that one
    row's loss through `module`, taken the plain way (one backward pass)."""
    module.zero_grad()
    loss.sum().backward()
    for name, p in module.named_parameters():
        torch.testing.assert_close(batched[name][row], p.grad, rtol=1e-4, atol=1e-6)


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


def assert_ledger_counts_both_phases(trainer: Any, config: Any, directory: Path) -> dict[int, float]:
    """Run `trainer` on SMALL_SCHEDULE (4 autoencoder steps, 3 GAN steps of 2 critic updates): its ledger
    holds exactly those updates, each checkpoint's epsilon is theirs so far, and the release carries the
    last. Returns the checkpoints' epsilons by step."""
    result = trainer.run()
    assert [u.phase for u in result.updates] == ["autoencoder"] * 4 + ["critic"] * 6
    phase1 = Phase(config.autoencoder_rate, config.autoencoder_noise, 4)
    phase2 = Phase(config.critic_rate, config.critic_noise, 6)
    assert trainer.accountant.phases == (phase1, phase2)
    assert [(e["step"], e["phase"]) for e in result.checkpoints] == [
        (0, "autoencoder"),
        (2, "autoencoder"),
        (4, "autoencoder"),
        (6, "gan"),
        (7, "gan"),
    ]
    eps = {e["step"]: e["epsilon"] for e in result.checkpoints}
    assert eps[0] == 0.0 and eps[4] == pytest.approx(epsilon([phase1], DELTA))
    assert eps[6] == pytest.approx(epsilon([phase1, Phase(phase2.sample_rate, phase2.noise_multiplier, 4)], DELTA))
    assert eps[7] == trainer.epsilon() == pytest.approx(epsilon([phase1, phase2], DELTA))
    # What a miscount would report instead: each critic update counted twice, or phase 1 left out.
    assert eps[7] < epsilon([phase1, Phase(phase2.sample_rate, phase2.noise_multiplier, 12)], DELTA) - 0.05
    assert eps[7] > epsilon([phase2], DELTA) + 0.05
    blob = torch.load(directory / result.checkpoints[-1]["release"], weights_only=False)
    assert blob["epsilon"] == eps[7] and blob["adjacency"] == "add/remove-one"
    return eps
