"""Ghost clipping (models/generators/ghost_clipping.py) is the clipping DP-auto-GAN trains with: it must give
the per-example path's clipped sum (dpsgd.clipped_sum of vmap'd per-row gradients) on the networks that use
it, bound each row's contribution jointly, zero a non-finite row, and refuse networks it cannot handle."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpsynth.models.generators.dpautogan.autoencoder import (
    autoencoder_clipped_sum,
    autoencoder_per_example,
)
from dpsynth.models.generators.dpautogan.config import DPAutoGANConfig
from dpsynth.models.generators.dpautogan.networks import Autoencoder, Critic
from dpsynth.models.generators.dpautogan.trainer import DPAutoGANTrainer
from dpsynth.models.generators.dpsgd import clipped_sum, poisson_batch
from dpsynth.models.generators.ghost_clipping import ghost_clipped_sum
from dpsynth.models.generators.two_phase.pairs import critic_pair_clipped_sum, critic_per_pair
from tests.models.two_phase_tables import DELTA, GROUPS, SMALL_SCHEDULE, WIDTH, toy_table


def autoencoder(seed: int = 0, head: str = "typed") -> Autoencoder:
    torch.manual_seed(seed)
    return Autoencoder(WIDTH, 3, (8, 6), (6, 8), head, GROUPS)


def assert_same_sums(ghost: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert list(ghost) == list(reference)  # parameter order: the noise is drawn in it
    for k in reference:
        torch.testing.assert_close(ghost[k], reference[k], rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("clip", [1e-3, 0.5, 1e4])  # every row clipped, some, none
@pytest.mark.parametrize("head", ["typed", "tanh"])
def test_the_autoencoders_ghost_sum_is_the_per_example_clipped_sum(clip, head):
    ae = autoencoder(head=head)
    rows = toy_table(40)
    rows[5] *= 50.0  # one row far outside [-1, 1]
    weights = torch.linspace(0.5, 3.0, WIDTH)
    for w in (None, weights):
        assert_same_sums(
            autoencoder_clipped_sum(ae, rows, clip, w), clipped_sum(autoencoder_per_example(ae, rows, w), clip)
        )


@pytest.mark.parametrize("in_width", [WIDTH, 3])
def test_the_critics_ghost_pair_sum_is_the_per_pair_clipped_sum(in_width):
    torch.manual_seed(1)
    critic = Critic(in_width, (8, 4))
    real = toy_table(30)[:, :in_width]
    fake = toy_table(30, seed=4)[:, :in_width] * 0.3
    real[2, 0] = 300.0
    for clip in (0.01, 0.3, 1e4):
        assert_same_sums(
            critic_pair_clipped_sum(critic, real, fake, clip), clipped_sum(critic_per_pair(critic, real, fake), clip)
        )
    with pytest.raises(ValueError, match="one fake per real"):
        critic_pair_clipped_sum(critic, real, fake[:3], 0.1)


def test_one_row_moves_the_ghost_sum_by_at_most_the_clip_over_all_layers_together():
    ae, clip = autoencoder(), 0.05
    rows = toy_table(12)
    extreme = rows[:1].clone()
    extreme[0, 0] = 300.0

    def flat(sums):
        return torch.cat([v.reshape(-1) for v in sums.values()])

    base = flat(autoencoder_clipped_sum(ae, rows, clip))
    assert float(base.norm()) <= clip * 12 + 1e-5
    moved = flat(autoencoder_clipped_sum(ae, torch.cat([rows, extreme]), clip)) - base
    assert float(moved.norm()) <= clip + 1e-5
    one = autoencoder_clipped_sum(ae, extreme, clip)
    assert float(flat(one).norm()) == pytest.approx(clip, rel=1e-4)  # joint: the whole row's norm is C


def test_a_row_with_a_nan_or_an_infinity_contributes_nothing():
    ae = autoencoder()
    rows = toy_table(10)
    bad = rows.clone()
    bad[3, 1] = float("nan")
    bad[7, 0] = float("inf")
    keep = [i for i in range(10) if i not in (3, 7)]
    ghost = autoencoder_clipped_sum(ae, bad, 0.5)
    assert all(bool(torch.isfinite(v).all()) for v in ghost.values())
    assert_same_sums(ghost, autoencoder_clipped_sum(ae, rows[keep], 0.5))
    assert_same_sums(ghost, clipped_sum(autoencoder_per_example(ae, bad), 0.5))  # the per-example path agrees


def test_an_empty_batch_gives_zeros_in_parameter_order():
    ae = autoencoder()
    empty = autoencoder_clipped_sum(ae, toy_table(4)[:0], 0.5)
    assert list(empty) == [k for k, _ in ae.named_parameters()]
    assert all(float(v.abs().max()) == 0 for v in empty.values())


@pytest.mark.parametrize(
    "network",
    [
        nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 1)),  # couples the rows of a batch
        nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.1), nn.Linear(3, 1)),  # not known to be row-local
        nn.Sequential(nn.Linear(4, 3), nn.LeakyReLU(0.2, inplace=True), nn.Linear(3, 1)),  # overwrites outputs
        nn.Sequential(nn.Unflatten(1, (1, 4)), nn.Conv1d(1, 1, 2)),  # parameters of another kind
    ],
)
def test_networks_ghost_clipping_cannot_handle_are_refused(network):
    rows = torch.rand(6, 4)
    with pytest.raises(ValueError, match="ghost clipping"):
        ghost_clipped_sum(network, lambda: network(rows).sum(-1).reshape(6, -1).sum(1), 1.0)


@pytest.mark.parametrize("phase", ["autoencoder", "critic"])
def test_a_training_update_releases_the_per_example_clipped_sum_of_its_poisson_batch(tmp_path, test_secret, phase):
    """What the trainer's updates sum is the per-example mechanism's sum for the batch it drew."""
    config = DPAutoGANConfig(
        **SMALL_SCHEDULE,
        **{"latent_dim": 3, "z_dim": 4, "encoder_hidden": (8,), "decoder_hidden": (8,), "critic_hidden": (8, 4)},
    ).model_copy(update={"autoencoder_rate": 0.3, "critic_rate": 0.3})
    data = toy_table(60)
    trainer = DPAutoGANTrainer(data, GROUPS, config, 0, test_secret, tmp_path, delta=DELTA)
    replay = torch.Generator()
    replay.set_state(trainer.sampling_rng.get_state())
    index = poisson_batch(60, 0.3, replay)
    assert 0 < index.numel() < 60
    if phase == "autoencoder":
        expected = clipped_sum(trainer.autoencoder_gradients(data[index]), config.autoencoder_clip)
        _, parts = trainer.autoencoder_update()
    else:
        expected = clipped_sum(trainer.pair_gradients(0, index), config.critic_clip)
        _, parts = trainer.critic_update(0)
    assert_same_sums(parts.clipped_sum, expected)
    assert float(torch.cat([v.reshape(-1) for v in expected.values()]).abs().max()) > 0


@pytest.mark.parametrize("real", [True, False])
def test_the_conditional_discriminators_ghost_sums_are_the_per_example_clipped_sums(real):
    """DP-CGAN's and DP-Fed-CTGAN's discriminators (real and generated rows clipped on their own)."""
    from dpsynth.models.generators.dpcgan import networks as cgan
    from dpsynth.models.generators.dpcgan.trainer import per_sample_gradients as cgan_rows
    from dpsynth.models.generators.dpfedctgan import networks as fed
    from dpsynth.models.generators.dpfedctgan.local_training import per_sample_gradients as fed_rows
    from dpsynth.models.generators.ghost_clipping import discriminator_clipped_sum

    torch.manual_seed(2)
    rows = toy_table(25)
    rows[4, 0] = 200.0
    labels = torch.randint(0, 2, (25,))
    condition = torch.nn.functional.one_hot(torch.randint(0, 3, (25,)), 3).float()
    for disc, cond, reference in (
        (cgan.ConditionalDiscriminator(WIDTH, (8, 4)), labels, cgan_rows),
        (fed.ConditionalDiscriminator(WIDTH, (8,), 3), condition, fed_rows),
    ):
        for clip in (0.01, 0.7, 1e4):
            assert_same_sums(
                discriminator_clipped_sum(disc, rows, cond, real, clip),
                clipped_sum(reference(disc, rows, cond, real=real), clip),
            )


def test_the_clipping_benchmark_runs_at_a_tiny_size_and_compares_both_paths(capsys):
    """bench/clipping.py at a tiny batch: it still imports what it times, and both sums agree."""
    from bench.clipping import main

    before = torch.get_num_threads()
    try:
        summary = main(["--rows", "40", "--repeats", "1"])
    finally:
        torch.set_num_threads(before)
    (result,) = summary["results"]
    assert result["rows"] == 40 and result["ghost_cpu_s"] > 0 and result["naive_cpu_s"] > 0
    assert result["largest_relative_difference"] < 1e-4
    assert '"benchmark": "clipping"' in capsys.readouterr().out.splitlines()[-1]
