"""The privacy audit (models/privacy/audit.py): its statistics; a reduced step audit on the trainer's own query
that catches the shared critic scored with the per-row accounting; reduced calibration audits of every
sanitising function, which must show most of the exact epsilon and refute half the noise; and
chi-square tests of GS-WGAN's secret critic draws (uniform, independent, continued across a resume)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpsynth.models.generators.gswgan.audit import StepAuditSetup, step_audit
from dpsynth.models.privacy.audit import audit_scores, clopper_pearson, epsilon_from_rates


def test_clopper_pearson_and_rate_bounds():
    lo, hi = clopper_pearson(0, 1000, 0.975)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-6)
    lo, hi = clopper_pearson(500, 1000, 0.975)
    assert lo < 0.5 < hi and hi - lo < 0.07
    # No advantage, no bound; a clear advantage, a positive one; delta eats a small true positive rate.
    assert epsilon_from_rates(500, 1000, 500, 1000, 1e-5) == 0.0
    assert epsilon_from_rates(900, 1000, 100, 1000, 1e-5) > 1.5
    assert epsilon_from_rates(5, 1000, 0, 1000, 0.01) == 0.0


def test_audit_of_a_gaussian_with_known_epsilon_stays_below_it():
    """Scores of a Gaussian mechanism with mu = 1: its true epsilon at delta 1e-5 is about 4.4; a
    lower bound from 20,000 trials sits below it and above zero."""
    rng = np.random.default_rng(0)
    first, second = rng.normal(1.0, 1.0, 20000), rng.normal(0.0, 1.0, 20000)
    bound = audit_scores({"x": (first, second)}, 1e-5).epsilon_lower_bound
    assert 0.3 < bound < 4.4


def test_reduced_step_audit_refutes_the_old_accounting_and_not_the_current_one():
    setup = StepAuditSetup(discriminators=50, batch_size=32, delta=1e-3)
    audits = {a["mechanism"]: a for a in step_audit(setup, trials=6000, steps=1, seed=0)}
    per_row, old, thesis = (
        audits["per_row"],
        audits["per_step scored as T x B (the old accounting)"],
        audits["per_step"],
    )
    assert not per_row["claim_refuted"] and per_row["epsilon_lower_bound"] < per_row["epsilon_claimed"]
    assert old["claim_refuted"] and old["epsilon_lower_bound"] > old["epsilon_claimed"] == per_row["epsilon_claimed"]
    assert not thesis["claim_refuted"] and thesis["epsilon_claimed"] > 10 * per_row["epsilon_claimed"]
    assert math.isfinite(old["epsilon_lower_bound"])
    # The exact epsilon of the mechanism that ran: below the RDP claim, above every valid bound.
    for audit in (per_row, old, thesis):
        assert audit["epsilon_lower_bound"] <= audit["epsilon_exact"] and not audit["exceeds_exact"]
    assert per_row["epsilon_exact"] < per_row["epsilon_claimed"]
    assert old["epsilon_exact"] == thesis["epsilon_exact"] < thesis["epsilon_claimed"]


def test_one_run_bound_grows_with_correct_guesses_and_vanishes_at_chance():
    from dpsynth.models.privacy.audit import one_run_epsilon_lower_bound, one_run_p_value

    assert one_run_epsilon_lower_bound(1000, 100, 50, 1e-5) == 0.0  # chance
    weak, strong = (one_run_epsilon_lower_bound(1000, 100, v, 1e-5) for v in (70, 95))
    assert 0 < weak < strong
    # The bound is where the p-value crosses 5%.
    assert (
        one_run_p_value(1000, 100, 95, strong - 0.01, 1e-5)
        < 0.05
        <= one_run_p_value(1000, 100, 95, strong + 0.01, 1e-5)
    )
    # With pure DP the p-value is the binomial tail.
    assert one_run_p_value(10, 10, 10, 0.0, 0.0) == pytest.approx(0.5**10)


# ------------------------------------------------------------------------------- calibration audits


@pytest.fixture
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Trials per input: 10^5 where the code under audit takes many trials per call; the moment query is
# called once per trial (about 0.1 ms each), so fewer there. At 10^5 a Gaussian mechanism with mu 0.93
# (exact 4.05) gives bounds near 2.5 with the intended noise and near 4.8 with half of it; at 4 x 10^4,
# near 2.0 and 4.5.
REDUCED = {
    "gswgan-sanitiser": (100_000, 0.45),
    "dpcgan-update": (100_000, 0.45),
    "dpautogan-update": (100_000, 0.45),
    "dpautogan-gaussian-fit": (100_000, 0.45),
    "dpautogan-moments": (40_000, 0.35),
    "measured-marginals": (100_000, 0.45),
}


@pytest.mark.parametrize("mechanism", list(REDUCED))
def test_reduced_calibration_audit_has_power_and_refutes_half_the_noise(mechanism, _one_thread):
    from dpsynth.models.generators.audit_table import calibration_audit_table

    trials, power = REDUCED[mechanism]
    audit = calibration_audit_table()[mechanism]
    intended = audit(trials=trials, seed=1)
    assert intended["trials"] == trials and not intended["halve_noise"]
    assert intended["epsilon_exact"] <= intended["epsilon_claimed"]
    assert 3.9 < intended["epsilon_exact"] < 4.2
    assert power * intended["epsilon_exact"] < intended["epsilon_lower_bound"] <= intended["epsilon_exact"]
    assert not intended["exceeds_exact"]
    halved = audit(trials=trials, halve_noise=True, seed=1)
    assert halved["noise_multiplier_run"] == intended["noise_multiplier"] / 2
    assert halved["epsilon_exact"] == intended["epsilon_exact"]  # judged against the intended noise
    assert halved["epsilon_lower_bound"] > halved["epsilon_exact"] and halved["exceeds_exact"] and halved["passed"]


# The generators' own calibration audits (each generator package's audit.py, listed through its registration),
# 10^5 trials per input. The selections' exact epsilon is their pair's (3.85 for MST's, 3.48 for AIM's), and
# a selection scored by its likelihood ratio shows nearly all of it.
REDUCED_GENERATOR_AUDITS = {
    "mst-measurement": (100_000, 0.45, 4.05),
    "mst-selection": (100_000, 0.8, 3.85),
    "aim-measurement": (100_000, 0.45, 4.05),
    "aim-selection": (100_000, 0.8, 3.48),
    "rdpcgan-critic-update": (100_000, 0.45, 4.05),
    "dpfedctgan-client-update": (100_000, 0.45, 4.05),
}


def test_the_audit_table_lists_every_generators_audits_then_the_marginals():
    """Each audit comes from its generator's registration (the privacy layer imports no generator), the
    measured marginals' last; together the twelve audited above."""
    import dpsynth.models.privacy.audit as machinery
    from dpsynth.models.generator_registry import registrations
    from dpsynth.models.generators.audit_table import calibration_audit_table

    table = list(calibration_audit_table())
    registered = [name for r in registrations() for name in r.calibration_audits()]
    assert table == registered + ["measured-marginals"]
    assert sorted(table) == sorted([*REDUCED, *REDUCED_GENERATOR_AUDITS])
    assert not hasattr(machinery, "CALIBRATION_AUDITS")


@pytest.mark.parametrize("mechanism", list(REDUCED_GENERATOR_AUDITS))
def test_reduced_generator_calibration_audit_has_power_and_refutes_half_the_noise(mechanism, _one_thread):
    from dpsynth.models.generators.audit_table import calibration_audit_table

    trials, power, exact = REDUCED_GENERATOR_AUDITS[mechanism]
    audit = calibration_audit_table()[mechanism]
    intended = audit(trials=trials, seed=1)
    assert intended["mechanism"] == mechanism and intended["trials"] == trials and not intended["halve_noise"]
    assert intended["epsilon_exact"] == pytest.approx(exact, abs=0.01)
    assert intended["epsilon_exact"] <= intended["epsilon_claimed"]
    assert power * intended["epsilon_exact"] < intended["epsilon_lower_bound"] <= intended["epsilon_exact"]
    assert intended["passed"] == (intended["epsilon_lower_bound"] >= 0.6 * intended["epsilon_exact"])
    halved = audit(trials=trials, halve_noise=True, seed=1)
    assert halved["noise_multiplier_run"] == intended["noise_multiplier"] / 2
    assert halved["epsilon_exact"] == intended["epsilon_exact"]  # judged against the intended noise
    assert halved["epsilon_lower_bound"] > halved["epsilon_exact"] and halved["exceeds_exact"] and halved["passed"]


def test_discrete_epsilon_of_randomised_response_is_its_log_odds():
    from dpsynth.models.privacy.exact_loss import discrete_delta, discrete_epsilon

    odds = math.exp(1.5)
    p, q = np.array([odds, 1.0]) / (1 + odds), np.array([1.0, odds]) / (1 + odds)
    assert discrete_epsilon(0.0, p, q) == pytest.approx(1.5, abs=1e-6)
    assert discrete_delta(1.0, p, q) == pytest.approx(p[0] - math.e * q[0])
    assert discrete_epsilon(1e-5, p, p) == 0.0


def test_calibration_audit_catches_clipping_each_parameter_on_its_own(monkeypatch, _one_thread):
    """DP-SGD's clip is one norm over all parameters. A sanitiser that clipped each layer to C on its own
    would let the canary (spread over several layers) move the sum by more than 2C."""
    from dpsynth.models.generators import ghost_clipping
    from dpsynth.models.generators.dpautogan.audit import dpautogan_update_audit

    joint = ghost_clipping.clip_factors

    def per_layer(squared, clip):
        return {name: joint({name: sq}, clip)[name] for name, sq in squared.items()}

    monkeypatch.setattr(ghost_clipping, "clip_factors", per_layer)
    audit = dpautogan_update_audit(trials=100_000, seed=1)
    assert audit["epsilon_lower_bound"] > audit["epsilon_exact"] and not audit["passed"]


def test_the_audited_gaussian_fit_query_is_the_one_fit_gaussian_latent_runs():
    """gaussian_fit_audit calls noisy_sums on latent_statistics with gaussian_bound (vectorised over
    trials); fit_gaussian_latent must release exactly that query's noisy sums (its mean, here)."""
    from dpsynth.models.generators.dpautogan.latent_gaussian import (
        fit_gaussian_latent,
        gaussian_bound,
        latent_statistics,
        noisy_sums,
    )

    latents = torch.rand(40, 3, generator=torch.Generator().manual_seed(0)) * 2 - 1
    mean, _ = fit_gaussian_latent(latents, 1.4, torch.Generator().manual_seed(5))
    sums = noisy_sums(latent_statistics(latents.double()), 1.4, gaussian_bound(3), torch.Generator().manual_seed(5))
    assert torch.equal(mean, (sums[:3] / 40).float())


# ------------------------------------------------------------------- GS-WGAN's critic draws

DRAW_K, DRAW_STEPS = 8, 800  # 800 steps of B = 32: 25,600 draws, 400 x 32 on each side of a resume


def _draw_trainer(tmp_path, name: str):
    from dpsynth.models.config import PrivacyConfig, Setting
    from dpsynth.models.generators.gswgan.config import GanConfig
    from dpsynth.models.generators.gswgan.partition import make_partition
    from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer
    from dpsynth.models.generators.networks import CriticStack
    from dpsynth.models.privacy.secret import PrivacySecret
    from tests.conftest import TEST_SECRET_HEX

    secret = PrivacySecret.from_hex(TEST_SECRET_HEX)
    gan = GanConfig(
        z_dim=4,
        generator_hidden=(8,),
        critic_hidden=16,
        batch_size=32,
        critic_refresh_steps=1,
        iterations=DRAW_STEPS,
        checkpoint_every=DRAW_STEPS // 2,
        kernels="torch",
    )
    data = torch.rand(DRAW_K * 20, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    critics = CriticStack(DRAW_K, 4, 16, False, "default", torch.Generator().manual_seed(1))
    return GeneratorTrainer(
        data,
        make_partition(len(data), DRAW_K, secret),
        critics,
        gan,
        PrivacyConfig(),
        Setting("draws", DRAW_K),
        [],
        0,
        tmp_path / name,
        torch.device("cpu"),
        secret,
    )


def _recorded_draws(tmp_path, monkeypatch, name: str, interrupted: bool) -> np.ndarray:
    """[steps, B]: every critic draw of a training run (noise drawn from the same secret stream in
    between, as in training), interrupted after its middle checkpoint and resumed by a fresh trainer
    that loads the saved state, or not."""
    from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer

    draws, original = [], GeneratorTrainer.draw_critics

    def recording(self):
        drawn = original(self)
        draws.append(drawn.clone())
        return drawn

    monkeypatch.setattr(GeneratorTrainer, "draw_critics", recording)
    if interrupted:
        _draw_trainer(tmp_path, name).run(DRAW_STEPS, stop_after=DRAW_STEPS // 2)
        assert len(draws) == DRAW_STEPS // 2
    _draw_trainer(tmp_path, name).run(DRAW_STEPS)
    monkeypatch.setattr(GeneratorTrainer, "draw_critics", original)
    return torch.stack(draws).numpy()


def _pairs_p_value(first: np.ndarray, second: np.ndarray) -> float:
    """chi2_contingency of K x K counts of pairs (first[i], second[i]): independence. A critic never drawn
    on one side (about 1600 expected) leaves no table to test: p = 0."""
    from scipy.stats import chi2_contingency

    table = np.zeros((DRAW_K, DRAW_K))
    np.add.at(table, (first.ravel(), second.ravel()), 1)
    if (table.sum(0) == 0).any() or (table.sum(1) == 0).any():
        return 0.0
    return float(chi2_contingency(table)[1])


def _draw_p_values(draws: np.ndarray) -> dict[str, float]:
    """Uniformity over the K critics, then independence of disjoint pairs: rows (2i, 2i + 1) of a step,
    the same row of steps (2t, 2t + 1), and the same row and step on either side of the middle checkpoint."""
    from scipy.stats import chisquare

    half = len(draws) // 2
    return {
        "uniform": float(chisquare(np.bincount(draws.ravel(), minlength=DRAW_K))[1]),
        "rows": _pairs_p_value(draws[:, 0::2], draws[:, 1::2]),
        "steps": _pairs_p_value(draws[0::2], draws[1::2]),
        "resume": _pairs_p_value(draws[:half], draws[half:]),
    }


def test_critic_draws_are_uniform_and_independent_across_rows_steps_and_a_resume(tmp_path, monkeypatch, _one_thread):
    resumed = _recorded_draws(tmp_path, monkeypatch, "resumed", interrupted=True)
    uninterrupted = _recorded_draws(tmp_path, monkeypatch, "whole", interrupted=False)
    assert resumed.shape == (DRAW_STEPS, 32)
    # The resumed trainer continues the saved stream: the very draws of the uninterrupted run.
    assert np.array_equal(resumed, uninterrupted)
    p = _draw_p_values(resumed)
    assert min(p.values()) > 1e-3, p


def test_the_draw_tests_reject_repeated_rows_a_restarted_stream_and_a_restart_on_resume(
    tmp_path, monkeypatch, _one_thread
):
    """The statistics above have power: a draw where every odd row repeats the row before it, one from a
    stream restarted before every step (the same critics every step), and a resume that restarts the
    secret stream instead of loading its state, are each rejected by the statistic meant for them."""
    from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer
    from dpsynth.models.privacy.secret import PrivacySecret
    from tests.conftest import TEST_SECRET_HEX

    original_draw, original_load = GeneratorTrainer.draw_critics, GeneratorTrainer._load_state

    def repeating(self):
        drawn = original_draw(self).clone()
        drawn[1::2] = drawn[0::2]
        return drawn

    def restarted(self):
        self.privacy_rng.manual_seed(PrivacySecret.from_hex(TEST_SECRET_HEX).seed("training"))
        return original_draw(self)

    for broken, statistic in ((repeating, "rows"), (restarted, "steps")):
        monkeypatch.setattr(GeneratorTrainer, "draw_critics", broken)
        trainer = _draw_trainer(tmp_path, broken.__name__)
        draws = np.stack([trainer.draw_critics().numpy() for _ in range(DRAW_STEPS)])
        assert _draw_p_values(draws)[statistic] < 1e-12, broken.__name__

    def restarting(self):
        loaded = original_load(self)
        self.privacy_rng = PrivacySecret.from_hex(TEST_SECRET_HEX).torch("training")
        return loaded

    monkeypatch.setattr(GeneratorTrainer, "draw_critics", original_draw)
    monkeypatch.setattr(GeneratorTrainer, "_load_state", restarting)
    assert _draw_p_values(_recorded_draws(tmp_path, monkeypatch, "restarting", interrupted=True))["resume"] < 1e-12


# ------------------------------------------------------------------- the release audit (MST, GDP)


def test_gdp_audit_recovers_most_of_a_gaussians_mu_and_nothing_of_no_difference():
    from dpsynth.models.privacy.audit import gaussian_epsilon
    from dpsynth.models.privacy.gdp_audit import gdp_audit, gdp_mu_of

    rng = np.random.default_rng(0)
    audit = gdp_audit(rng.normal(0.5, 1.0, 40_000), rng.normal(0.0, 1.0, 40_000), 1e-5)
    assert 0.4 < audit.mu_lower_bound <= 0.5
    assert audit.epsilon_lower_bound == pytest.approx(gaussian_epsilon(audit.mu_lower_bound, 1e-5))
    assert gdp_audit(rng.normal(0, 1, 40_000), rng.normal(0, 1, 40_000), 1e-5).mu_lower_bound < 0.03
    assert gaussian_epsilon(gdp_mu_of(1.0, 1e-5), 1e-5) == pytest.approx(1.0, abs=1e-6)


def test_the_worst_case_table_moves_each_selection_score_by_the_whole_sensitivity():
    """The canary (0, 0, 0) against (0, 1, 1) on the release audit's table: (a, b)'s score 2 higher on the
    first input, (a, c)'s 2 lower, (b, c)'s unchanged, the three otherwise tied."""
    from dpsynth.models.generators.mst.fit import pair_scores
    from dpsynth.models.generators.mst.release_audit import COLUMNS, ReleaseAuditSetup, neighbours

    inputs = neighbours(ReleaseAuditSetup(rows=2000))
    scores = {}
    for first, frame in inputs.items():
        codes = [frame[c].to_numpy().astype(int) for c in COLUMNS]
        shares = [np.bincount(c, minlength=2) / len(c) for c in codes]
        scores[first] = pair_scores(codes, [2, 2, 2], shares)
    moved = {pair: scores[True][pair] - scores[False][pair] for pair in scores[True]}
    assert moved[(0, 1)] == pytest.approx(2.0, abs=0.01) and moved[(0, 2)] == pytest.approx(-2.0, abs=0.01)
    assert moved[(1, 2)] == pytest.approx(0.0, abs=0.01)
    assert max(scores[False].values()) - min(scores[False].values()) < 2.5


def test_the_release_audit_runs_end_to_end_at_a_tiny_size():
    """A benchmark, not a check of power: 30 runs per input through `bench.audit --mode release`."""
    from bench.audit import main

    summary = main(["--mode", "release", "--runs", "30", "--workers", "1", "--json"])
    (audit,) = summary["audits"]
    assert audit["epsilon_claimed"] == pytest.approx(1.0, abs=1e-3) and audit["runs"] == 30
    assert 0.0 <= audit["epsilon_lower_bound"] <= audit["epsilon_claimed"]
    assert audit["mu_of_rho"] == pytest.approx(math.sqrt(2 * audit["rho"]), abs=1e-4)
    assert sum(sum(seen) for seen in audit["trees_seen"].values()) == 30  # two calibration halves of 15
