"""DP-CGAN (models/generators/dpcgan/): the sanitised discriminator gradient, the mechanism the accountant counts,
exact resume, valid samples, and that training learns a planted label dependency. Tiny tables only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.models.checkpoint_files import sidecar
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.dpcgan.config import DPCGANConfig
from dpsynth.models.generators.dpcgan.networks import ConditionalDiscriminator
from dpsynth.models.generators.dpcgan.sampler import load_generator, sample_encoded
from dpsynth.models.generators.dpcgan.trainer import DPCGANTrainer, per_sample_gradients, sanitized_gradient
from dpsynth.models.privacy.dpsgd_accountant import Phase, epsilon
from dpsynth.models.privacy.secret import PrivacySecret

# Encoded layout of the toy table: a continuous column, the binary target, a 3-level categorical.
GROUPS = [(0, 1, "continuous"), (1, 2, "binary"), (2, 5, "categorical")]
TARGET = 1
WIDTH = 5


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small models: threads cost more than they give


def toy_table(n: int, seed: int = 0) -> torch.Tensor:
    """Rows in [-1, 1] whose continuous column and categorical level depend on the label: x near +0.6
    and level 0 for label 1, x near -0.6 and level 2 for label 0."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.5).float() * 2 - 1
    x = (0.6 * y + 0.1 * torch.randn(n, generator=g)).clamp(-1, 1)
    cat = -torch.ones(n, 3)
    cat[torch.arange(n), torch.where(y > 0, 0, 2)] = 1.0
    return torch.cat([x[:, None], y[:, None], cat], 1)


DELTA = 1e-5


def small_config(**overrides) -> DPCGANConfig:
    """The paper's optimisers (SGD for D, Adam for G) and "typed" head, on a tiny network."""
    base = {
        "sample_rate": 0.25,
        "clip": 1.0,
        "noise_multiplier": 1.0,
        "iterations": 6,
        "checkpoint_every": 2,
        "z_dim": 4,
        "generator_hidden": (16,),
        "discriminator_hidden": (16,),
        "head": "typed",
        "discriminator_optimizer": "sgd",
        "lr_discriminator": 0.05,
    }
    return DPCGANConfig(**{**base, **overrides})


def make_trainer(data, target: int, config: DPCGANConfig, seed: int, secret, directory) -> DPCGANTrainer:
    """The trainer as the adapter builds it: the section, and the run's delta."""
    return DPCGANTrainer(data, target, GROUPS, config, seed, secret, directory, delta=DELTA)


def discriminator(seed: int = 0, hidden=(16,)) -> ConditionalDiscriminator:
    torch.manual_seed(seed)
    return ConditionalDiscriminator(WIDTH, hidden)


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads.values()])


def labels_of(rows: torch.Tensor) -> torch.Tensor:
    return (rows[:, TARGET] > 0).long()


# ------------------------------------------------------------------------------------------- networks


def test_discriminator_passes_opacus_validator_and_batchnorm_would_not():
    from opacus.validators import ModuleValidator

    assert ModuleValidator.validate(discriminator(hidden=(16, 8)), strict=False) == []
    ModuleValidator.validate(discriminator(hidden=(16, 8)), strict=True)  # raises on any error
    with_batchnorm = nn.Sequential(nn.Linear(WIDTH + 2, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    assert ModuleValidator.validate(with_batchnorm, strict=False)  # the validator does catch BatchNorm


def test_target_column_must_be_binary(tmp_path, test_secret):
    with pytest.raises(ConfigError, match="binary"):
        make_trainer(toy_table(40), 0, small_config(), 0, test_secret, tmp_path)
    bad = toy_table(40)
    bad[3, TARGET] = 0.5
    with pytest.raises(ConfigError, match="-1 or \\+1"):
        make_trainer(bad, TARGET, small_config(), 0, test_secret, tmp_path)


# ------------------------------------------------------------------------- clipping and noise


def test_per_sample_gradients_match_one_row_at_a_time():
    disc = discriminator()
    rows = toy_table(5)
    for real in (True, False):
        batched = per_sample_gradients(disc, rows, labels_of(rows), real)
        for i in range(rows.shape[0]):
            disc.zero_grad()
            logit = disc(rows[i : i + 1], labels_of(rows[i : i + 1]))
            F.binary_cross_entropy_with_logits(logit, torch.full_like(logit, float(real))).backward()
            for name, p in disc.named_parameters():
                torch.testing.assert_close(batched[name][i], p.grad, rtol=1e-5, atol=1e-6)


def test_clipping_bounds_each_real_row_contribution():
    disc = discriminator()
    clip = 0.05
    rows = toy_table(12)
    extreme = rows[:1].clone()
    extreme[0, 0] = 400.0  # far outside [-1, 1]: its gradient dwarfs everyone else's
    per_row = per_sample_gradients(disc, rows, labels_of(rows), real=True)
    assert (
        float(flat({k: v[0] for k, v in per_sample_gradients(disc, extreme, labels_of(extreme), True).items()}).norm())
        > 20 * clip
    )
    assert float(torch.cat([g.reshape(12, -1) for g in per_row.values()], 1).norm(dim=1).min()) > clip  # all clipped

    def real_sum(r):
        return sanitized_gradient(disc, r, labels_of(r), r[:0], labels_of(r[:0]), clip, 0.0, 16, None).real_sum

    base = flat(real_sum(rows))
    assert float(base.norm()) <= clip * rows.shape[0] + 1e-5
    # Clip each row, then sum (not: sum, then clip the batch): the same as clipping row by row.
    rows_flat = torch.cat([g.reshape(12, -1) for g in per_row.values()], 1)
    by_row = sum(g * min(1.0, clip / float(g.norm())) for g in rows_flat)
    torch.testing.assert_close(base, by_row, rtol=1e-5, atol=1e-6)
    with_extreme = flat(real_sum(torch.cat([rows, extreme])))
    assert float((with_extreme - base).norm()) <= clip + 1e-5


def test_fake_part_is_clipped_per_row_too():
    disc = discriminator()
    clip = 0.05
    fake = toy_table(8, seed=3)
    fake[0, 0] = 400.0
    parts = sanitized_gradient(disc, fake[:0], labels_of(fake[:0]), fake, labels_of(fake), clip, 0.0, 8, None)
    assert float(flat(parts.fake_sum).norm()) <= clip * 8 + 1e-5
    without = sanitized_gradient(disc, fake[:0], labels_of(fake[:0]), fake[1:], labels_of(fake[1:]), clip, 0.0, 8, None)
    assert float((flat(parts.fake_sum) - flat(without.fake_sum)).norm()) <= clip + 1e-5


def test_noise_is_one_draw_on_the_real_part_only():
    disc = discriminator(hidden=(64,))
    real, fake = toy_table(10, seed=1), toy_table(16, seed=2)
    clip, sigma, batch = 0.5, 3.0, 16
    clean = sanitized_gradient(disc, real, labels_of(real), fake, labels_of(fake), clip, 0.0, batch, None)
    noisy = sanitized_gradient(
        disc, real, labels_of(real), fake, labels_of(fake), clip, sigma, batch, torch.Generator().manual_seed(7)
    )
    # The clipped sums do not see the noise; the fake sum is exactly the noiseless one.
    torch.testing.assert_close(flat(noisy.fake_sum), flat(clean.fake_sum), rtol=0, atol=0)
    torch.testing.assert_close(flat(noisy.real_sum), flat(clean.real_sum), rtol=0, atol=0)
    added = flat(noisy.total) * batch - flat(clean.real_sum) - flat(clean.fake_sum)
    # Exactly one N(0, sigma^2 C^2) vector from the given stream, in parameter order: noising the fake
    # part as well (DPGAN) would add a second draw and raise the spread to sqrt(2) sigma C.
    replay = torch.Generator().manual_seed(7)
    expected = torch.cat([torch.randn(p.shape, generator=replay).reshape(-1) * sigma * clip for p in disc.parameters()])
    torch.testing.assert_close(added, expected, rtol=1e-4, atol=1e-4)
    assert added.numel() > 500
    assert abs(float(added.std()) / (sigma * clip) - 1.0) < 0.1
    # An empty Poisson batch still gets its noise: the query ran.
    empty = sanitized_gradient(
        disc, real[:0], labels_of(real[:0]), fake, labels_of(fake), clip, sigma, batch, torch.Generator().manual_seed(7)
    )
    torch.testing.assert_close(flat(empty.total) * batch - flat(clean.fake_sum), expected, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------- the mechanism accounted


def test_poisson_batches_from_the_secret_and_one_accounted_query_per_update(tmp_path, test_secret):
    n, batch, updates, sigma = 200, 20, 60, 1.3
    cfg = small_config(sample_rate=batch / n, noise_multiplier=sigma, iterations=updates, checkpoint_every=30)
    trainer = make_trainer(toy_table(n), TARGET, cfg, 0, test_secret, tmp_path)
    result = trainer.run()
    sizes = [s.real_rows for s in result.steps]
    assert len(sizes) == updates
    # Poisson: sizes vary around q n (a fixed-size batch would give one size).
    assert len(set(sizes)) > 5
    assert abs(np.mean(sizes) - batch) < 2.5
    # Each row independently with probability q, drawn from the secret's sampling stream.
    replay = test_secret.torch("dpcgan-sampling")
    assert sizes == [int((torch.rand(n, generator=replay) < batch / n).sum()) for _ in range(updates)]
    # One composition per discriminator update, at the configured (q, sigma).
    assert trainer.accountant.steps == updates == trainer.iteration
    assert trainer.accountant.phases == (Phase(batch / n, sigma, updates),)
    eps = [e["epsilon"] for e in result.checkpoints]
    assert [e["iteration"] for e in result.checkpoints] == [0, 30, 60]
    assert eps[0] == 0.0
    assert eps[1] == pytest.approx(epsilon(Phase(batch / n, sigma, 30), DELTA))
    assert eps[2] == pytest.approx(epsilon(Phase(batch / n, sigma, 60), DELTA))
    assert eps[2] < epsilon(Phase(batch / n, sigma, 120), DELTA)  # what a double count would report


def test_update_applies_the_sanitised_sum_over_the_expected_batch(tmp_path, test_secret):
    """The divisor is the public expected batch size, never the drawn one (which would leak it), and the
    optimiser applies exactly the sanitised gradient (SGD: the step is -lr times it)."""
    cfg = small_config(sample_rate=0.2, noise_multiplier=2.0, lr_discriminator=0.1)
    trainer = make_trainer(toy_table(80), TARGET, cfg, 0, test_secret, tmp_path)
    assert trainer.expected_batch == pytest.approx(16)
    drawn = set()
    for _ in range(4):
        before = {k: v.detach().clone() for k, v in trainer.discriminator.named_parameters()}
        rows, parts = trainer.discriminator_step()
        drawn.add(rows)
        summed = flat(parts.real_sum) + flat(parts.noise) + flat(parts.fake_sum)
        torch.testing.assert_close(flat(parts.total) * trainer.expected_batch, summed, rtol=1e-5, atol=1e-6)
        step = {k: (before[k] - v.detach()) / cfg.lr_discriminator for k, v in trainer.discriminator.named_parameters()}
        torch.testing.assert_close(flat(step), flat(parts.total), rtol=1e-4, atol=1e-5)
    assert len(drawn) > 1 and drawn != {16}


def test_another_secret_draws_other_batches(tmp_path, test_secret):
    cfg = small_config(iterations=10, checkpoint_every=10)
    other = PrivacySecret.from_hex("a7" * 32)
    a = make_trainer(toy_table(80), TARGET, cfg, 0, test_secret, tmp_path / "a").run()
    b = make_trainer(toy_table(80), TARGET, cfg, 0, other, tmp_path / "b").run()
    assert [s.real_rows for s in a.steps] != [s.real_rows for s in b.steps]


# ------------------------------------------------------------------------------- checkpoints


def _states_equal(a: DPCGANTrainer, b: DPCGANTrainer) -> None:
    for net in ("generator", "discriminator"):
        sa, sb = getattr(a, net).state_dict(), getattr(b, net).state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), f"{net}.{k} differs"


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path, test_secret):
    cfg = small_config()
    data = toy_table(60)
    whole = make_trainer(data, TARGET, cfg, 5, test_secret, tmp_path / "whole")
    whole_result = whole.run()

    first = make_trainer(data, TARGET, cfg, 5, test_secret, tmp_path / "cut")
    first.run(stop_after=3)  # interrupted between the checkpoints at 2 and 4
    assert first.iteration == 3
    resumed = make_trainer(data, TARGET, cfg, 5, test_secret, tmp_path / "cut")
    result = resumed.run()
    assert resumed.iteration == 6 and resumed.accountant.steps == 6
    _states_equal(whole, resumed)
    assert [(e["iteration"], e["epsilon"], e["sha256"]) for e in result.checkpoints] == [
        (e["iteration"], e["epsilon"], e["sha256"]) for e in whole_result.checkpoints
    ]


def test_resume_skips_a_damaged_latest_state(tmp_path, test_secret):
    cfg = small_config()
    data = toy_table(60)
    whole = make_trainer(data, TARGET, cfg, 5, test_secret, tmp_path / "whole")
    whole.run()
    cut = make_trainer(data, TARGET, cfg, 5, test_secret, tmp_path / "cut")
    cut.run(last_iteration=4)
    state = tmp_path / "cut" / "training_state.pt"
    state.write_bytes(state.read_bytes()[:-10])  # truncated: its hash no longer matches
    resumed = make_trainer(data, TARGET, cfg, 5, test_secret, tmp_path / "cut")
    resumed.run()
    assert any("resumed from training_state.prev.pt (iteration 2)" in note for note in resumed.resume_notes)
    _states_equal(whole, resumed)


def test_resume_refuses_another_configuration(tmp_path, test_secret):
    make_trainer(toy_table(60), TARGET, small_config(), 5, test_secret, tmp_path).run(last_iteration=2)
    other = make_trainer(toy_table(60), TARGET, small_config(clip=2.0), 5, test_secret, tmp_path)
    with pytest.raises(ConfigError, match="another configuration"):
        other.run()


@pytest.mark.parametrize("head", ["typed", "gumbel"])
def test_sampled_rows_are_valid_and_carry_the_requested_label(tmp_path, test_secret, head):
    trainer = make_trainer(toy_table(60), TARGET, small_config(head=head), 5, test_secret, tmp_path)
    ledger = trainer.run().checkpoints
    last = ledger[-1]
    assert sidecar(tmp_path / last["generator"]).read_text().strip() == last["sha256"]
    gen, blob = load_generator(tmp_path / last["generator"], last["sha256"])
    assert blob["epsilon"] == last["epsilon"] and blob["adjacency"] == "add/remove-one"
    for label in (0, 1):
        rows = sample_encoded(gen, 300, seed=1, label=label)
        assert rows.shape == (300, WIDTH)
        assert np.all(rows >= -1) and np.all(rows <= 1)
        np.testing.assert_allclose(((rows[:, 2:5] + 1) / 2).sum(1), 1.0, atol=1e-5)  # a distribution
        assert np.all(rows[:, TARGET] == (1.0 if label else -1.0))
    mixed = sample_encoded(gen, 400, seed=2, label_prior=0.25)
    assert set(np.unique(mixed[:, TARGET])) == {-1.0, 1.0}
    assert 0.15 < float((mixed[:, TARGET] > 0).mean()) < 0.35
    np.testing.assert_array_equal(sample_encoded(gen, 50, seed=3, label=1), sample_encoded(gen, 50, seed=3, label=1))


# ---------------------------------------------------------------------------------- learning


def _label_gaps(gen) -> tuple[float, float]:
    """Mean of the continuous column, and of the first categorical level's indicator, label 1 minus
    label 0 (planted: +1.2 and +2.0)."""
    one, zero = sample_encoded(gen, 600, seed=11, label=1), sample_encoded(gen, 600, seed=11, label=0)
    return float(one[:, 0].mean() - zero[:, 0].mean()), float(one[:, 2].mean() - zero[:, 2].mean())


def test_training_learns_the_planted_label_dependency(tmp_path, test_secret):
    cfg = small_config(
        sample_rate=0.25,
        clip=1.0,
        noise_multiplier=0.8,
        iterations=300,
        checkpoint_every=300,
        z_dim=8,
        generator_hidden=(32,),
        discriminator_hidden=(32,),
        discriminator_optimizer="adam",
        lr_discriminator=2e-3,
        lr_generator=2e-3,
    )
    trainer = make_trainer(toy_table(256), TARGET, cfg, 0, test_secret, tmp_path)
    before = _label_gaps(trainer.generator)
    assert max(abs(g) for g in before) < 0.3  # the untrained generator ignores the label
    trainer.run()
    x_gap, level_gap = _label_gaps(trainer.generator)
    assert x_gap > 0.5 and level_gap > 0.8
