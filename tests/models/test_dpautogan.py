"""DP-auto-GAN (models/generators/dpautogan/): per-example clipping in both phases, the noise, Poisson batches,
the two accounted phases, exact resume in either phase, valid samples, and that the autoencoder learns.
Tiny tables, one thread."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from dpsynth.models.checkpoint_files import sidecar
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.dpautogan.autoencoder import autoencoder_per_example, reconstruction_loss
from dpsynth.models.generators.dpautogan.config import DPAutoGANConfig
from dpsynth.models.generators.dpautogan.latent_gaussian import (
    fit_gaussian_latent,
    gaussian_bound,
    latent_statistics,
    match_decoded_moments,
    moment_bound,
    moment_spread_from,
    moment_statistics,
    private_moments,
    spread_columns,
)
from dpsynth.models.generators.dpautogan.networks import (
    Autoencoder,
    Critic,
    Decoder,
    GaussianLatent,
    LatentGenerator,
    ReleaseSpec,
)
from dpsynth.models.generators.dpautogan.sampler import draw_levels, load_release, sample_encoded
from dpsynth.models.generators.dpautogan.trainer import DPAutoGANTrainer
from dpsynth.models.generators.dpsgd import clipped_sum, noisy_mean
from dpsynth.models.generators.two_phase.pairs import critic_per_pair, position_latents
from dpsynth.models.privacy.dpsgd_accountant import Phase, epsilon
from dpsynth.models.privacy.secret import PrivacySecret
from tests.models.two_phase_tables import (
    DELTA,
    GROUPS,
    SMALL_SCHEDULE,
    WIDTH,
    assert_ledger_counts_both_phases,
    assert_resume_equals_uninterrupted,
    assert_row_gradients,
    assert_states_equal,
    flat,
    toy_table,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small models: threads cost more than they give


def small_config(**overrides) -> DPAutoGANConfig:
    base = {
        **SMALL_SCHEDULE,
        "latent_dim": 3,
        "z_dim": 4,
        "encoder_hidden": (8,),
        "decoder_hidden": (8,),
        "generator_hidden": (8,),
        "critic_hidden": (8,),
    }
    return DPAutoGANConfig(**{**base, **overrides})


def make_trainer(data, config: DPAutoGANConfig, seed: int, secret, directory, **run) -> DPAutoGANTrainer:
    """The trainer as the adapter builds it: the section, and the run's delta (and schema-derived values)."""
    return DPAutoGANTrainer(data, GROUPS, config, seed, secret, directory, delta=DELTA, **run)


def row_norms(per_example: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten(1) for g in per_example.values()], 1).norm(dim=1)


def autoencoder(seed: int = 0) -> Autoencoder:
    torch.manual_seed(seed)
    return Autoencoder(WIDTH, 3, (8,), (8,), "typed", GROUPS)


# ------------------------------------------------------------------------------------------- networks


def test_private_modules_pass_opacus_validator_and_batchnorm_would_not():
    from opacus.validators import ModuleValidator

    for module in (autoencoder(), Critic(WIDTH, (8, 4)), Critic(3, (8,))):
        assert ModuleValidator.validate(module, strict=False) == []
        ModuleValidator.validate(module, strict=True)  # raises on any error
    with_batchnorm = nn.Sequential(nn.Linear(WIDTH, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    assert ModuleValidator.validate(with_batchnorm, strict=False)  # the validator does catch BatchNorm


@pytest.mark.parametrize("weights", [None, (10.0, 5.0, 1.0, 1.0, 1.0)], ids=["plain", "weighted"])
def test_per_example_gradients_match_one_row_at_a_time(weights):
    ae = autoencoder()
    critic = Critic(WIDTH, (8,))
    rows, fakes = toy_table(4), toy_table(4, seed=9) * 0.5
    w = None if weights is None else torch.tensor(weights)
    batched_ae = autoencoder_per_example(ae, rows, w)
    batched_d = critic_per_pair(critic, rows, fakes)
    assert any(k.startswith("encoder.") for k in batched_ae) and any(k.startswith("decoder.") for k in batched_ae)
    for i in range(rows.shape[0]):
        plain = reconstruction_loss(ae(rows[i : i + 1]), rows[i : i + 1], None)
        weighted = reconstruction_loss(ae(rows[i : i + 1]), rows[i : i + 1], w)
        if weights is not None:  # the weights reach the loss: it is not the plain sum
            assert not torch.allclose(plain, weighted)
        assert_row_gradients(ae, batched_ae, i, weighted)
        assert_row_gradients(critic, batched_d, i, critic(fakes[i : i + 1]) - critic(rows[i : i + 1]))


def test_bad_configuration_is_refused(tmp_path, test_secret):
    with pytest.raises(ConfigError, match="critic_space"):
        small_config(critic_space="both")
    with pytest.raises(ConfigError, match="critic_rate: must be below 1"):
        small_config(critic_rate=1.0)


# ------------------------------------------------------------------------- clipping and noise


def test_autoencoder_clipping_bounds_each_row_over_encoder_and_decoder_together():
    ae, clip = autoencoder(), 0.05
    rows = toy_table(12)
    extreme = rows[:1].clone()
    extreme[0, 0] = 300.0  # far outside [-1, 1]: its raw gradient dwarfs the others'
    assert float(row_norms(autoencoder_per_example(ae, extreme))[0]) > 20 * clip
    assert float(row_norms(autoencoder_per_example(ae, rows)).min()) > clip  # every row is clipped

    def summed(r):
        return flat(clipped_sum(autoencoder_per_example(ae, r), clip))

    base = summed(rows)
    assert float(base.norm()) <= clip * 12 + 1e-5
    assert float((summed(torch.cat([rows, extreme])) - base).norm()) <= clip + 1e-5
    # The norm is joint over encoder and decoder: clipping each part to C on its own would let a row
    # move the pair by up to sqrt(2) C. Here the encoder's clipped share alone stays below C, jointly.
    one = clipped_sum(autoencoder_per_example(ae, extreme), clip)
    assert float(flat(one).norm()) == pytest.approx(clip, rel=1e-4)
    enc = torch.cat([v.reshape(-1) for k, v in one.items() if k.startswith("encoder.")])
    dec = torch.cat([v.reshape(-1) for k, v in one.items() if k.startswith("decoder.")])
    assert float(enc.norm()) > 0 and float(dec.norm()) > 0


@pytest.mark.parametrize("in_width", [WIDTH, 3])
def test_critic_clipping_bounds_each_real_example_with_its_fake(in_width):
    torch.manual_seed(1)
    critic, clip = Critic(in_width, (8,)), 0.05
    real = toy_table(10)[:, :in_width]
    fake = toy_table(10, seed=4)[:, :in_width] * 0.3
    extreme = real[:1].clone()
    extreme[0, 0] = 300.0

    def summed(r, f):
        return flat(clipped_sum(critic_per_pair(critic, r, f), clip))

    base = summed(real, fake)
    assert float(row_norms(critic_per_pair(critic, extreme, fake[:1]))[0]) > 20 * clip
    assert float(base.norm()) <= clip * 10 + 1e-5
    # Adding one real example (with the fake drawn for it) moves the sum by at most C: the real and the
    # fake term are clipped together, one vector per real example (the paper's microbatch of one).
    assert float((summed(torch.cat([real, extreme]), torch.cat([fake, fake[:1] * 50])) - base).norm()) <= clip + 1e-5
    with pytest.raises(ValueError, match="one fake per real"):
        critic_per_pair(critic, real, fake[:3])


def test_noise_is_one_draw_of_sigma_c_over_the_expected_batch():
    ae = autoencoder()
    rows = toy_table(10)
    clip, sigma, batch = 0.5, 3.0, 16
    clean = noisy_mean(clipped_sum(autoencoder_per_example(ae, rows), clip), clip, 0.0, batch, None)
    noisy = noisy_mean(
        clipped_sum(autoencoder_per_example(ae, rows), clip), clip, sigma, batch, torch.Generator().manual_seed(7)
    )
    torch.testing.assert_close(flat(noisy.clipped_sum), flat(clean.clipped_sum), rtol=0, atol=0)
    added = flat(noisy.total) * batch - flat(clean.clipped_sum)
    replay = torch.Generator().manual_seed(7)
    expected = torch.cat([torch.randn(p.shape, generator=replay).reshape(-1) * sigma * clip for p in ae.parameters()])
    torch.testing.assert_close(added, expected, rtol=1e-4, atol=1e-4)
    assert abs(float(added.std()) / (sigma * clip) - 1.0) < 0.15
    # An empty Poisson batch still gets its noise: the query ran.
    empty = noisy_mean(
        clipped_sum(autoencoder_per_example(ae, rows[:0]), clip), clip, sigma, batch, torch.Generator().manual_seed(7)
    )
    torch.testing.assert_close(flat(empty.total) * batch, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("phase", ["autoencoder", "critic"])
def test_update_applies_exactly_the_sanitised_gradient(tmp_path, test_secret, phase):
    trainer = make_trainer(toy_table(80), small_config(), 0, test_secret, tmp_path)
    net, update = (
        (trainer.autoencoder, trainer.autoencoder_update)
        if phase == "autoencoder"
        else (trainer.critic, lambda: trainer.critic_update(0))
    )
    optimizer = trainer.opt_ae if phase == "autoencoder" else trainer.opt_critic
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    state = {k: v.detach().clone() for k, v in before.items()}
    _, parts = update()
    # Replay the step with a fresh optimiser of the same kind on the recorded total: same weights.
    replay = {k: nn.Parameter(v) for k, v in state.items()}
    opt = type(optimizer)(list(replay.values()), **{k: v for k, v in optimizer.defaults.items()})
    for k, p in replay.items():
        p.grad = parts.total[k]
    opt.step()
    for k, v in net.named_parameters():
        torch.testing.assert_close(v.detach(), replay[k].detach(), rtol=0, atol=0)
        assert not torch.equal(v.detach(), before[k]) or parts.total[k].abs().max() == 0


# --------------------------------------------------------------------- the mechanism accounted


def test_poisson_batches_from_the_secret_in_both_phases(tmp_path, test_secret):
    n, cfg = (
        200,
        small_config(
            autoencoder_rate=0.1,
            critic_rate=0.15,
            autoencoder_steps=40,
            critic_steps=4,
            generator_steps=10,
            checkpoint_every=50,
        ),
    )
    result = make_trainer(toy_table(n), cfg, 0, test_secret, tmp_path).run()
    ae_sizes = [u.real_rows for u in result.updates if u.phase == "autoencoder"]
    critic_sizes = [u.real_rows for u in result.updates if u.phase == "critic"]
    assert len(ae_sizes) == 40 and len(critic_sizes) == 40
    for sizes, batch in ((ae_sizes, 20), (critic_sizes, 30)):
        assert len(set(sizes)) > 5  # a fixed-size batch would give one size
        assert abs(np.mean(sizes) - batch) < 0.2 * batch
    replay = test_secret.torch("dpautogan-sampling")
    expected = [int((torch.rand(n, generator=replay) < q).sum()) for q in [0.1] * 40 + [0.15] * 40]
    assert ae_sizes + critic_sizes == expected


@pytest.mark.parametrize("space", ["data", "latent"])
def test_accountant_counts_exactly_the_private_updates_of_both_phases(tmp_path, test_secret, space):
    n = 60
    cfg = small_config(critic_space=space)
    trainer = make_trainer(toy_table(n), cfg, 0, test_secret, tmp_path)
    eps = assert_ledger_counts_both_phases(trainer, cfg, tmp_path)
    phase1 = Phase(cfg.autoencoder_rate, cfg.autoencoder_noise, 4)
    assert eps[2] == pytest.approx(epsilon(Phase(phase1.sample_rate, phase1.noise_multiplier, 2), DELTA))


# ------------------------------------------------------------------------------- checkpoints


NETS = ("autoencoder", "generator", "critic", "gaussian")  # the networks a checkpoint restores


@pytest.mark.parametrize("stop_after", [3, 6], ids=["in-phase-1", "in-phase-2"])
def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path, test_secret, stop_after):
    cfg = small_config(autoencoder_steps=5, generator_steps=4)
    assert_resume_equals_uninterrupted(make_trainer, cfg, test_secret, tmp_path, stop_after, NETS)


def test_resume_skips_a_damaged_latest_state_and_refuses_another_configuration(tmp_path, test_secret):
    cfg, data = small_config(), toy_table(60)
    whole = make_trainer(data, cfg, 5, test_secret, tmp_path / "whole")
    whole.run()
    cut = make_trainer(data, cfg, 5, test_secret, tmp_path / "cut")
    cut.run(stop_after=6)  # checkpoints at 4 (end of phase 1) and 6 (in phase 2)
    state = tmp_path / "cut" / "training_state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    resumed = make_trainer(data, cfg, 5, test_secret, tmp_path / "cut")
    resumed.run()
    assert any("resumed from training_state.prev.pt (step 4)" in note for note in resumed.resume_notes)
    assert_states_equal(whole, resumed, NETS)
    other = make_trainer(data, small_config(critic_clip=2.0), 5, test_secret, tmp_path / "cut")
    with pytest.raises(ConfigError, match="another configuration"):
        other.run()


# ------------------------------------------------------------------------------ sampling and learning


@pytest.mark.parametrize("space", ["data", "latent"])
def test_sampled_rows_are_in_range_with_valid_one_hot_groups(tmp_path, test_secret, space):
    trainer = make_trainer(toy_table(60), small_config(critic_space=space), 5, test_secret, tmp_path)
    last = trainer.run().checkpoints[-1]
    assert sidecar(tmp_path / last["release"]).read_text().strip() == last["sha256"]
    decoder, generator, blob = load_release(tmp_path / last["release"], last["sha256"])
    assert blob["step"] == 7
    for k, v in generator.state_dict().items():
        assert torch.equal(v, trainer.generator.state_dict()[k])
    rows = sample_encoded(decoder, generator, 300, seed=1)
    assert rows.shape == (300, WIDTH) and rows.dtype == np.float32
    assert np.all(rows >= -1) and np.all(rows <= 1)
    np.testing.assert_allclose(((rows[:, 2:5] + 1) / 2).sum(1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(rows, sample_encoded(decoder, generator, 300, seed=1))
    assert sample_encoded(decoder, generator, 0, seed=1).shape == (0, WIDTH)


def _fixed_decoder(level_logits, binary_logit: float) -> tuple[Decoder, LatentGenerator]:
    """A decoder whose discrete columns have the same probabilities for every latent."""
    decoder, generator = ReleaseSpec(WIDTH, 3, 4, (8,), (8,), "typed", tuple(GROUPS)).build()
    with torch.no_grad():
        last = decoder.body[-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.0, binary_logit, *level_logits]))
    return decoder.eval(), generator.eval()


def test_sampled_level_decoding_keeps_a_level_that_argmax_never_emits():
    probs = torch.tensor([0.90, 0.08, 0.02])
    decoder, generator = _fixed_decoder(probs.log().tolist(), binary_logit=math.atanh(2 * 0.03 - 1))
    argmax = sample_encoded(decoder, generator, 20_000, seed=3)
    drawn = sample_encoded(decoder, generator, 20_000, seed=3, level_decoding="sample")
    assert set(np.unique(argmax[:, 2:5].argmax(1))) == {0} and np.all(argmax[:, 1] < 0)
    # Every group is a +-1 one-hot row, every binary column +-1; the continuous column is untouched.
    assert set(np.unique(drawn[:, 2:5])) == {-1.0, 1.0} and np.all((drawn[:, 2:5] > 0).sum(1) == 1)
    assert set(np.unique(drawn[:, 1])) == {-1.0, 1.0}
    # The uniforms follow each batch's z on the same stream: the first batch's z are argmax's.
    np.testing.assert_array_equal(drawn[:8192, 0], argmax[:8192, 0])
    shares = np.bincount(drawn[:, 2:5].argmax(1), minlength=3) / len(drawn)
    np.testing.assert_allclose(shares, probs.numpy(), atol=0.006)  # 3 sd of 20,000 draws at p = 0.08
    assert abs((drawn[:, 1] > 0).mean() - 0.03) < 0.004
    np.testing.assert_array_equal(drawn, sample_encoded(decoder, generator, 20_000, seed=3, level_decoding="sample"))


def test_draw_levels_follows_each_rows_own_probabilities():
    # Columns: continuous, a 3-level group, binary (probability of +1: 0.25).
    rows = torch.tensor(
        [[0.5, 2 * 0.0 - 1, 2 * 1.0 - 1, 2 * 0.0 - 1, -0.5], [0.5, 2 * 0.7 - 1, 2 * 0.0 - 1, 2 * 0.3 - 1, -0.5]]
    )
    out = draw_levels(rows, [(1, 4)], [4], torch.tensor([[0.99, 0.24], [0.69, 0.26]]))
    assert out[:, 0].tolist() == [0.5, 0.5]
    assert out[0, 1:4].tolist() == [-1.0, 1.0, -1.0]  # probability 1 on the middle level
    assert out[1, 1:4].tolist() == [1.0, -1.0, -1.0]  # 0.69 < 0.7: the first level
    assert out[:, 4].tolist() == [1.0, -1.0]
    out = draw_levels(rows, [(1, 4)], [4], torch.tensor([[0.0, 0.0], [0.71, 0.999]]))
    assert out[0, 1:4].tolist() == [-1.0, 1.0, -1.0]  # a zero-probability level is never drawn
    assert out[1, 1:4].tolist() == [-1.0, -1.0, 1.0]
    assert out[:, 4].tolist() == [1.0, -1.0]


def test_reconstruction_weights_are_checked_and_reach_the_autoencoders_update(tmp_path, test_secret):
    with pytest.raises(ConfigError, match="finite numbers > 0"):
        make_trainer(
            toy_table(60),
            small_config(),
            5,
            test_secret,
            tmp_path / "zero",
            reconstruction_weights=(1.0, 0.0, 1.0, 1.0, 1.0),
        )
    with pytest.raises(ConfigError, match=r"5 finite numbers > 0 expected, one per encoded column \(got 4\)"):
        make_trainer(
            toy_table(60), small_config(), 5, test_secret, tmp_path / "short", reconstruction_weights=(1.0,) * 4
        )
    runs = {}
    for name, weights in (("plain", None), ("ones", (1.0,) * WIDTH), ("weighted", (10.0, 5.0, 1.0, 1.0, 1.0))):
        trainer = make_trainer(
            toy_table(60), small_config(), 5, test_secret, tmp_path / name, reconstruction_weights=weights
        )
        trainer.autoencoder_update()
        runs[name] = torch.cat([p.detach().reshape(-1) for p in trainer.autoencoder.parameters()])
    assert torch.equal(runs["plain"], runs["ones"])
    assert not torch.allclose(runs["plain"], runs["weighted"])


def test_sampled_level_decoding_needs_the_softmax_head_and_old_files_keep_argmax():
    with pytest.raises(ConfigError, match="level_decoding: sample needs head: typed"):
        small_config(head="tanh", level_decoding="sample")
    with pytest.raises(ConfigError, match="level_decoding: 'mode' is not one of"):
        small_config(level_decoding="mode")
    assert small_config(head="tanh", level_decoding="argmax").head == "tanh"
    old = ReleaseSpec(WIDTH, 3, 4, (8,), (8,), "typed", tuple(GROUPS)).to_dict()
    del old["level_decoding"]
    assert ReleaseSpec.from_dict(old).level_decoding == "argmax"


def _reconstruction_error(trainer: DPAutoGANTrainer, rows: torch.Tensor) -> float:
    with torch.no_grad():
        return float(((trainer.autoencoder(rows) - rows) ** 2).mean())


def test_private_autoencoder_learns_to_reconstruct(tmp_path, test_secret):
    data = toy_table(256)
    cfg = small_config(
        autoencoder_rate=0.25,
        autoencoder_clip=1.0,
        autoencoder_noise=0.3,
        autoencoder_steps=150,
        checkpoint_every=150,
        lr_autoencoder=0.02,
        encoder_hidden=(16,),
        decoder_hidden=(16,),
    )
    trainer = make_trainer(data, cfg, 0, test_secret, tmp_path)
    untrained = _reconstruction_error(trainer, data)
    assert untrained > 0.3
    trainer.run(last_step=150)  # phase 1 only
    assert trainer.accountant.steps == 150
    assert _reconstruction_error(trainer, data) < 0.1 * untrained


# ------------------------------------------------------------------------------ the Gaussian latent model


def test_one_rows_latent_statistics_are_bounded_by_the_gaussian_bound():
    d = 4
    corners = torch.tensor([[1.0, -1.0, 1.0, -1.0], [1.0] * d, [-1.0] * d])
    inside = torch.rand(500, d, generator=torch.Generator().manual_seed(0)) * 2 - 1
    norms = latent_statistics(torch.cat([corners, inside])).norm(dim=1)
    assert latent_statistics(corners).shape == (3, d + d * (d + 1) // 2)
    assert torch.all(norms <= gaussian_bound(d) + 1e-6)
    assert norms[:3].max() == pytest.approx(gaussian_bound(d))  # attained at the corners: the bound is tight


def test_gaussian_fit_adds_one_draw_of_sigma_times_the_bound_to_the_sums():
    d, n, sigma = 3, 40, 2.5
    g = torch.Generator().manual_seed(4)
    noise = torch.randn(d + d * (d + 1) // 2, generator=g, dtype=torch.float64) * sigma * gaussian_bound(d)
    # All-zero latents: the noisy sums are the noise alone.
    mean, _ = fit_gaussian_latent(torch.zeros(n, d), sigma, torch.Generator().manual_seed(4))
    torch.testing.assert_close(mean, (noise[:d] / n).float())
    # Without noise (sigma -> 0) the fit is the latents' mean and covariance.
    latents = torch.rand(n, d, generator=g) * 2 - 1
    mean, scale = fit_gaussian_latent(latents, 1e-12, torch.Generator().manual_seed(1))
    torch.testing.assert_close(mean, latents.mean(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(scale @ scale.T, torch.cov(latents.T, correction=0), atol=1e-5, rtol=0)


def test_gaussian_latent_model_fits_once_from_the_secret_and_samples_in_range(tmp_path, test_secret):
    cfg = small_config(latent_model="gaussian", latent_noise=3.0, autoencoder_steps=4)
    data = toy_table(60)
    trainer = make_trainer(data, cfg, 5, test_secret, tmp_path)
    assert cfg.total_steps == 5
    trainer.run(stop_after=4)
    assert trainer.phase == "gaussian"
    with torch.no_grad():
        latents = trainer.autoencoder.encoder(trainer.data[:])
    noise = torch.Generator()
    noise.set_state(trainer.noise_rng.get_state())
    expected_mean, expected_scale = fit_gaussian_latent(latents, 3.0, noise)
    result = trainer.run()
    assert torch.equal(trainer.gaussian.mean, expected_mean) and torch.equal(trainer.gaussian.scale, expected_scale)
    assert [(p.sample_rate, p.noise_multiplier, p.steps) for p in trainer.accountant.phases] == [
        (0.25, 1.0, 4),
        (1.0, 3.0, 1),
    ]
    assert [(e["step"], e["phase"]) for e in result.checkpoints] == [
        (0, "autoencoder"),
        (2, "autoencoder"),
        (4, "autoencoder"),
        (5, "gaussian"),
    ]
    decoder, latent, _ = load_release(tmp_path / result.checkpoints[-1]["release"])
    assert isinstance(latent, GaussianLatent) and torch.equal(latent.mean, expected_mean)
    rows = sample_encoded(decoder, latent, 400, seed=2, level_decoding="sample")
    assert np.all(np.abs(rows) <= 1) and set(np.unique(rows[:, 1:])) == {-1.0, 1.0}
    # The critic and the GAN's generator never moved: phase 2 read the data only through the fit.
    fresh = make_trainer(data, cfg, 5, test_secret, tmp_path / "fresh")
    for net in ("critic", "generator"):
        for k, v in getattr(fresh, net).state_dict().items():
            assert torch.equal(v, getattr(trainer, net).state_dict()[k])


def test_gaussian_latent_model_resumes_to_the_same_release(tmp_path, test_secret):
    cfg = small_config(latent_model="gaussian", latent_noise=3.0, autoencoder_steps=4)
    data = toy_table(60)
    whole = make_trainer(data, cfg, 5, test_secret, tmp_path / "whole").run()
    make_trainer(data, cfg, 5, test_secret, tmp_path / "cut").run(stop_after=3)
    resumed = make_trainer(data, cfg, 5, test_secret, tmp_path / "cut").run()
    assert [(e["step"], e["sha256"]) for e in resumed.checkpoints] == [
        (e["step"], e["sha256"]) for e in whole.checkpoints
    ]


# ------------------------------------------------------------------------------ the decoded-moment fit


def test_one_rows_moment_statistics_are_bounded_by_the_moment_bound():
    binary = [False, True, False]
    corners = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0], [1.0, 1.0, 1.0]])
    inside = torch.rand(500, 3, generator=torch.Generator().manual_seed(0)) * 2 - 1
    stats = moment_statistics(torch.cat([corners, inside]), binary)
    assert stats.shape[1] == 3 + 3 + 2  # values, the three products, the squares of the two non-binary columns
    assert torch.all(stats.norm(dim=1) <= moment_bound(3, 1) + 1e-6)
    assert stats[:3].norm(dim=1).max() == pytest.approx(moment_bound(3, 1))  # tight at the corners


def test_private_moments_clip_the_rows_and_add_one_draw_of_sigma_times_the_bound():
    binary, sigma = [False, True], 3.0
    rows = torch.tensor([[2.0, 1.0], [-0.5, -1.0], [0.25, 1.0], [-3.0, -1.0]])  # out of range: clipped
    got = private_moments(rows, binary, sigma, torch.Generator().manual_seed(7))
    noise = torch.randn(4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    clipped = rows.double().clamp(-1, 1)
    exact = moment_statistics(clipped, binary).sum(0)
    torch.testing.assert_close(got, (exact + noise * sigma * moment_bound(2, 1)) / 4)


def test_the_spread_centres_and_scales_from_decoded_rows_and_the_query_clips_after_it():
    decoded = torch.tensor([[0.1, 1.0], [0.3, -1.0], [0.2, 1.0], [0.2, -1.0]])
    center, width = moment_spread_from(decoded, [False, True], 2.0)
    torch.testing.assert_close(center, torch.tensor([0.2, 0.0], dtype=torch.float64))
    torch.testing.assert_close(
        width, torch.tensor([2.0 * float(decoded[:, 0].double().std()), 1.0], dtype=torch.float64)
    )
    rows = torch.tensor([[0.9, 1.0], [0.2, -1.0]])
    spread = spread_columns(rows.double(), center, width)
    assert spread[0, 0] == 1.0 and abs(float(spread[1, 0])) < 1e-6 and spread[:, 1].tolist() == [1.0, -1.0]
    got = private_moments(rows, [False, True], 2.0, torch.Generator().manual_seed(3), center, width)
    noise = torch.randn(4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    exact = moment_statistics(spread, [False, True]).sum(0)
    torch.testing.assert_close(got, (exact + noise * 2.0 * moment_bound(2, 1)) / 2)


def test_the_moment_fit_moves_the_gaussian_towards_the_target_moments():
    """A fixed decoder; targets made by another Gaussian: the decoded moments get much closer to them,
    and the result is the same for the same stream."""
    torch.manual_seed(0)
    decoder = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    columns, binary = (0, 1, 3), [False, False, False]
    start_mean, start_scale = torch.zeros(3), torch.eye(3) * 0.3
    true_mean, true_scale = torch.tensor([0.3, -0.2, 0.1]), torch.tensor([[0.4, 0, 0], [0.2, 0.3, 0], [0, -0.1, 0.2]])

    def decoded_moments(mean, scale):
        z = (mean + torch.randn(20_000, 3, generator=torch.Generator().manual_seed(1)) @ scale.T).clamp(-1, 1)
        with torch.no_grad():
            return moment_statistics(decoder(z)[:, list(columns)], binary).mean(0)

    targets = decoded_moments(true_mean, true_scale).double()
    fits = [
        match_decoded_moments(
            decoder,
            start_mean,
            start_scale,
            columns,
            binary,
            targets,
            200,
            0.0,
            torch.Generator().manual_seed(3),
            draws=4096,
        )
        for _ in range(2)
    ]
    mean, scale = fits[0]
    assert torch.equal(mean, fits[1][0]) and torch.equal(scale, fits[1][1])
    before = (decoded_moments(start_mean, start_scale) - targets.float()).norm()
    after = (decoded_moments(mean, scale) - targets.float()).norm()
    assert after < 0.1 * before
    assert torch.equal(scale, torch.tril(scale))
    assert all(p.requires_grad for p in decoder.parameters())  # the decoder is left as it was


@pytest.mark.parametrize("spread", [None, 3.0])
def test_a_moment_fit_is_one_more_accounted_query_after_the_gaussian_fit(tmp_path, test_secret, spread):
    cfg = small_config(
        latent_model="gaussian",
        latent_noise=3.0,
        autoencoder_steps=4,
        moment_noise=5.0,
        moment_steps=20,
        moment_spread=spread,
    )
    data = toy_table(60)
    trainer = make_trainer(data, cfg, 5, test_secret, tmp_path / "whole", moment_columns=(0, 1))
    trainer.run(stop_after=4)
    # What the last step must do, from the same streams: the Gaussian fit, then the moment query (the
    # secret's noise, in that order), then the fit through the frozen decoder (the seed's stream).
    noise, seeded = torch.Generator(), torch.Generator()
    noise.set_state(trainer.noise_rng.get_state())
    seeded.set_state(trainer.rng.get_state())
    with torch.no_grad():
        mean0, scale0 = fit_gaussian_latent(trainer.autoencoder.encoder(trainer.data[:]), 3.0, noise)
    center = width = None
    if spread is not None:  # from rows the fitted Gaussian decodes to, the seed's stream
        fitted = GaussianLatent(cfg.latent_dim)
        fitted.mean.copy_(mean0)
        fitted.scale.copy_(scale0)
        with torch.no_grad():
            decoded = trainer.autoencoder.decoder(fitted(torch.randn(16384, cfg.latent_dim, generator=seeded)))
        center, width = moment_spread_from(decoded[:, [0, 1]], [False, True], spread)
    targets = private_moments(trainer.data[:][:, [0, 1]], [False, True], 5.0, noise, center, width)
    mean, scale = match_decoded_moments(
        trainer.autoencoder.decoder,
        mean0,
        scale0,
        (0, 1),
        [False, True],
        targets,
        20,
        cfg.moment_anchor,
        seeded,
        center=center,
        width=width,
    )
    result = trainer.run()
    torch.testing.assert_close(trainer.gaussian.mean, mean, rtol=0, atol=1e-7)
    torch.testing.assert_close(trainer.gaussian.scale, scale, rtol=0, atol=1e-7)
    assert not torch.allclose(mean, mean0)
    phases = [Phase(0.25, 1.0, 4), Phase(1.0, 3.0, 1), Phase(1.0, 5.0, 1)]
    assert [(p.sample_rate, p.noise_multiplier, p.steps) for p in trainer.accountant.phases] == [
        (p.sample_rate, p.noise_multiplier, p.steps) for p in phases
    ]
    assert result.checkpoints[-1]["step"] == 5 and result.checkpoints[-1]["epsilon"] == pytest.approx(
        epsilon(phases, DELTA), rel=1e-9
    )
    # an interrupted run resumes to the same release
    make_trainer(data, cfg, 5, test_secret, tmp_path / "cut", moment_columns=(0, 1)).run(stop_after=4)
    resumed = make_trainer(data, cfg, 5, test_secret, tmp_path / "cut", moment_columns=(0, 1)).run()
    assert [(e["step"], e["sha256"]) for e in resumed.checkpoints] == [
        (e["step"], e["sha256"]) for e in result.checkpoints
    ]


def test_the_moment_fit_is_checked(tmp_path, test_secret):
    with pytest.raises(ConfigError, match="moment_noise: a moment fit needs latent_model: gaussian"):
        small_config(moment_noise=5.0)
    with pytest.raises(ConfigError, match="moment_noise: must be above 0"):
        small_config(latent_model="gaussian", moment_noise=0.0)
    with pytest.raises(ConfigError, match="moment_spread: must be above 0"):
        small_config(latent_model="gaussian", moment_noise=5.0, moment_spread=0.0)
    with pytest.raises(ConfigError, match="needs dpautogan.latent_model gaussian and dpautogan.moment_noise"):
        make_trainer(
            toy_table(20), small_config(latent_model="gaussian"), 0, test_secret, tmp_path, moment_columns=(0,)
        )
    with pytest.raises(ConfigError, match="below 5"):
        make_trainer(
            toy_table(20),
            small_config(latent_model="gaussian", moment_noise=5.0),
            0,
            test_secret,
            tmp_path,
            moment_columns=(0, 7),
        )


def test_latent_model_is_checked():
    with pytest.raises(ConfigError, match="latent_model: 'vae' is not one of"):
        small_config(latent_model="vae")
    with pytest.raises(ConfigError, match="latent_noise: must be above 0"):
        small_config(latent_model="gaussian", latent_noise=0.0)


def test_a_rows_fake_latent_depends_on_its_position_and_the_update_only():
    key = 12345
    a = position_latents(key, 7, torch.tensor([0, 3, 5, 9]), 4)
    b = position_latents(key, 7, torch.tensor([3, 9, 11]), 4)
    assert torch.equal(a[[1, 3]], b[:2])
    assert not torch.equal(position_latents(key, 8, torch.tensor([3]), 4), a[1:2])
    assert not torch.equal(position_latents(key + 1, 7, torch.tensor([3]), 4), a[1:2])
    many = position_latents(key, 0, torch.arange(20000), 3).double()
    assert abs(float(many.mean())) < 0.02 and abs(float(many.std()) - 1) < 0.02
    from scipy.stats import kstest

    assert kstest(many[:, 1].numpy(), "norm").pvalue > 1e-3
    assert abs(float(torch.corrcoef(many.T)[0, 1])) < 0.03


def test_critic_phase_sampling_moves_no_other_pair_and_no_seeded_draw(tmp_path, test_secret):
    """Two secrets draw different Poisson batches; the seeded stream (the generator's latents) must end
    the GAN phase in the same state, and each sampled row's fake must be its position's."""
    cfg = small_config(autoencoder_steps=1, generator_steps=3, critic_steps=2, critic_rate=0.2, checkpoint_every=100)
    states, sizes = [], []
    for i, secret in enumerate([test_secret, PrivacySecret.from_hex("cd" * 32)]):
        trainer = make_trainer(toy_table(100), cfg, 0, secret, tmp_path / f"r{i}")
        infos = trainer.step()  # the autoencoder's update
        for _ in range(3):
            infos += trainer.step()
        states.append(trainer.rng.get_state())
        sizes.append([u.real_rows for u in infos if u.phase == "critic"])
    assert sizes[0] != sizes[1]
    assert torch.equal(states[0], states[1])


def test_the_gaussian_fit_and_moment_sums_are_summed_in_chunks_as_over_all_rows(monkeypatch):
    """The fit and the moment query sum their statistics a chunk of rows at a time (their memory must not
    grow with the rows): the sums are the one-shot sums, whatever the chunk."""
    from dpsynth.models.generators.dpautogan import latent_gaussian

    rows = torch.rand(1000, 4, generator=torch.Generator().manual_seed(3)) * 2 - 1
    binary = [False, True, False, False]
    whole_fit = fit_gaussian_latent(rows, 2.0, torch.Generator().manual_seed(9))
    whole_moments = private_moments(rows, binary, 2.0, torch.Generator().manual_seed(9))
    monkeypatch.setattr(latent_gaussian, "CHUNK_ROWS", 64)
    for chunked, whole in zip(fit_gaussian_latent(rows, 2.0, torch.Generator().manual_seed(9)), whole_fit, strict=True):
        torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(
        private_moments(rows, binary, 2.0, torch.Generator().manual_seed(9)), whole_moments, rtol=1e-12, atol=1e-12
    )
    stats = latent_gaussian.summed_statistics(rows.double(), latent_gaussian.latent_statistics)
    torch.testing.assert_close(stats, latent_gaussian.latent_statistics(rows.double()).sum(0), rtol=1e-12, atol=1e-12)
