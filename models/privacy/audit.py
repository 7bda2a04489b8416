"""Empirical privacy auditing: lower bounds on epsilon from a distinguishing experiment.

A mechanism that is (epsilon, delta)-DP bounds every test that tells two neighbouring inputs apart:
TPR <= e^epsilon FPR + delta and (1 - FPR) <= e^epsilon (1 - TPR) + delta. Running a test many times on
both inputs and bounding its true and false positive rates with Clopper-Pearson intervals turns an
observed advantage into a lower bound on epsilon that holds with the stated confidence (Jagielski,
Ullman and Oprea 2020; Nasr et al. 2021). If the bound exceeds what an accountant claims, the claim is
false (with that confidence).

The threshold of the test is chosen on a calibration half of the trials and the bound is computed on
the other half, so choosing it costs no confidence.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy.stats import beta

from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.networks import CriticStack
from dpsynth.models.privacy.accountant import CRITIC_DRAWS, CriticDraw, epsilon_for
from dpsynth.models.privacy.secret import PrivacySecret

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.models.data.schema import DatasetSchema


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Two one-sided bounds on a binomial rate, each holding with probability `confidence`."""
    alpha = 1.0 - confidence
    lower = 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))
    return lower, upper


def epsilon_from_rates(
    tp: int, positives: int, fp: int, negatives: int, delta: float, confidence: float = 0.95
) -> float:
    """The epsilon lower bound implied by a test's counts (tp of `positives` trials on the first input
    called positive, fp of `negatives` on the second): both rates bounded at confidence
    1 - (1 - confidence) / 2 each, so the bound holds with `confidence`."""
    each = 1.0 - (1.0 - confidence) / 2.0
    tpr_lo, _ = clopper_pearson(tp, positives, each)
    _, fpr_hi = clopper_pearson(fp, negatives, each)
    bounds = [0.0]
    if fpr_hi > 0 and tpr_lo - delta > 0:
        bounds.append(math.log((tpr_lo - delta) / fpr_hi))
    # The complementary test (call the second input when the score is low): TNR = 1 - FPR against
    # FNR = 1 - TPR, with TNR bounded from below and FNR from above.
    if 1.0 - tpr_lo > 0 and (1.0 - fpr_hi) - delta > 0:
        bounds.append(math.log(((1.0 - fpr_hi) - delta) / (1.0 - tpr_lo)))
    return max(bounds)


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower_bound: float
    statistic: str
    threshold: float
    true_positives: int
    false_positives: int
    trials_per_input: int
    confidence: float


def _calibrate(a: np.ndarray, b: np.ndarray, delta: float, confidence: float) -> tuple[float, float]:
    """(bound, threshold) of the best threshold on calibration scores."""
    candidates = np.unique(np.concatenate([a, b]))
    if len(candidates) > 2000:
        candidates = np.unique(np.quantile(candidates, np.linspace(0.0, 1.0, 2001)))
    best, best_threshold = -1.0, float(candidates[-1]) if len(candidates) else 0.0
    sorted_a, sorted_b = np.sort(a), np.sort(b)
    for threshold in candidates:
        tp = len(a) - int(np.searchsorted(sorted_a, threshold, side="right"))
        fp = len(b) - int(np.searchsorted(sorted_b, threshold, side="right"))
        value = epsilon_from_rates(tp, len(a), fp, len(b), delta, confidence)
        if value > best:
            best, best_threshold = value, float(threshold)
    return best, best_threshold


def audit_scores(
    statistics: dict[str, tuple[np.ndarray, np.ndarray]], delta: float, confidence: float = 0.95
) -> AuditResult:
    """Lower bound from test scores: for each statistic, scores of trials on the first input (higher:
    more likely the first) and on the second. The statistic and its threshold are chosen on the first
    half of the trials; the bound is computed on the other half only."""
    best: tuple[float, str, float, np.ndarray, np.ndarray] | None = None
    for name, (first, second) in statistics.items():
        a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
        bound, threshold = _calibrate(a[: len(a) // 2], b[: len(b) // 2], delta, confidence)
        if best is None or bound > best[0]:
            best = (bound, name, threshold, a[len(a) // 2 :], b[len(b) // 2 :])
    if best is None:
        raise ValueError("no statistic to audit")
    _, name, threshold, test_a, test_b = best
    tp, fp = int((test_a > threshold).sum()), int((test_b > threshold).sum())
    bound = epsilon_from_rates(tp, len(test_a), fp, len(test_b), delta, confidence)
    return AuditResult(bound, name, threshold, tp, fp, min(len(test_a), len(test_b)), confidence)


def mixture_log_likelihood_ratio(
    projections: np.ndarray, probability: float, shift: float, noise_std: float, shared: bool
) -> np.ndarray:
    """Log-likelihood ratio of "some queries came from the shifted critic" for sanitised rows projected
    on the shift's direction, [trials, steps, rows]: under the second input every row is N(-shift/2,
    s^2); under the first, with probability q a query's rows are N(+shift/2, s^2) instead, each row on
    its own (`shared` False: a critic per row) or all rows of a step together (`shared` True)."""
    z = projections * (shift / noise_std**2)  # log N(+)/N(-) of each row
    log_keep, log_q = math.log1p(-probability), math.log(probability)
    if shared:
        per_step = np.logaddexp(log_keep, log_q + z.sum(axis=2))
        return per_step.sum(axis=1)
    return np.logaddexp(log_keep, log_q + z).sum(axis=(1, 2))


# ------------------------------------------------------------------------------- the step audit


@dataclass(frozen=True)
class StepAuditSetup:
    """The mechanism audited: K critics, B rows per step, noise multiplier, clip, delta."""

    discriminators: int = 100
    batch_size: int = 32
    noise_multiplier: float = 1.07
    clip: float = 1.0
    delta: float = 1e-5
    width: int = 4
    hidden: int = 16

    def claimed(self, critic_draw: str, steps: int) -> float:
        return epsilon_for(self.discriminators, steps, self.batch_size, self.noise_multiplier, self.delta, critic_draw)


def _linear_critics(upstream: torch.Tensor, hidden: int, bias: float) -> CriticStack:
    """K linear critics on [-1, 1]^d (every hidden unit active while |upstream_j . x| < bias): critic j's
    upstream gradient -grad D_j is upstream[j] for every row."""
    k, width = upstream.shape
    w1 = (-upstream).unsqueeze(-1).expand(k, width, hidden).contiguous()
    return CriticStack.from_params(
        [w1, torch.full((k, 1, hidden), bias), torch.full((k, hidden, 1), 1.0 / hidden), torch.zeros(k, 1, 1)],
        batchnorm=False,
    )


def planted_critics(setup: StepAuditSetup, first_input: bool, canary_critic: int = 0) -> CriticStack:
    """Linear critics on [-1, 1]^d (every hidden unit active): critic j's upstream gradient -grad D_j is
    -C e for every j, except the canary's critic on the first input: +C e, the worst case (the largest
    change of a clipped gradient, the same for every generated row)."""
    upstream = torch.zeros(setup.discriminators, setup.width)
    upstream[:, 0] = -setup.clip
    if first_input:
        upstream[canary_critic, 0] = setup.clip
    return _linear_critics(upstream, setup.hidden, 10.0 * setup.clip)


def canary_critics(setup: StepAuditSetup, first_input: bool, norm: float) -> CriticStack:
    """Every critic planted with the canary's gradient: upstream +norm e on the first input, -norm e on
    the neighbour, for every critic and every generated row (norm > C: clipping acts)."""
    upstream = torch.zeros(setup.discriminators, setup.width)
    upstream[:, 0] = norm if first_input else -norm
    return _linear_critics(upstream, setup.hidden, 10.0 * max(norm, setup.clip))


def sanitised_projections(
    setup: StepAuditSetup,
    critic_draw: CriticDraw,
    first_input: bool,
    trials: int,
    steps: int,
    secret: PrivacySecret,
    workdir: Path,
    critics: CriticStack | None = None,
) -> np.ndarray:
    """[trials, steps, B]: the first coordinate of every sanitised row of trials x steps queries of the
    trainer (`GeneratorTrainer.draw_critics`, then `generator_step`: the functions `step` calls, without
    the critic refresh, which planted critics do not need). `critics`: `planted_critics` unless given."""
    from dpsynth.models.generators.gswgan.partition import make_partition
    from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer

    k, b = setup.discriminators, setup.batch_size
    # Frozen critics (lr 0): outside what a profile may say, so built without the profile's validation.
    gan = GanConfig.model_construct(
        z_dim=4,
        generator_hidden=(16,),
        critic_hidden=setup.hidden,
        batch_size=b,
        lr_critic=0.0,
        critic_refresh_steps=1,
        critic_draw=critic_draw,
        iterations=1,
        checkpoint_every=1,
    )
    data = torch.rand(2 * k, setup.width, generator=torch.Generator().manual_seed(0)) * 2 - 1
    privacy = PrivacyConfig(noise_multiplier=setup.noise_multiplier, clip=setup.clip, delta=setup.delta)
    critics = planted_critics(setup, first_input) if critics is None else critics
    trainer = GeneratorTrainer(
        data,
        make_partition(2 * k, k, secret),
        critics,
        gan,
        privacy,
        Setting("audit", k),
        [],
        0,
        workdir,
        torch.device("cpu"),
        secret,
    )
    out = np.empty((trials * steps, b), dtype=np.float64)
    # One intra-op thread, as training runs: the step is many tiny operations.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(trials * steps):
            out[i] = trainer.generator_step(trainer.draw_critics())[:, 0].double().numpy()
    finally:
        torch.set_num_threads(before)
    return out.reshape(trials, steps, b)


def step_audit(setup: StepAuditSetup, trials: int, steps: int, seed: int = 0) -> list[dict]:
    """Three audits of T = `steps` steps, `trials` trials per input each (see bench/audit.py): the
    per-row mechanism against its claim, the shared critic against the per-row claim (the old
    accounting), and the shared critic against its own claim. Each also carries the exact epsilon of
    the mechanism that ran (models/privacy/exact_loss.py: the hockey-stick divergence of its worst-case pair,
    composed over the T steps), which no valid lower bound exceeds: the RDP claim sits above it, so a
    bound between the two refutes nothing and proves nothing about the claim's slack."""
    from dpsynth.models.privacy.exact_loss import QueryMechanism

    noise_std = 2.0 * setup.noise_multiplier * setup.clip
    observed: dict[tuple[str, bool], np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for draw in CRITIC_DRAWS:
            for first in (True, False):
                secret = PrivacySecret.from_hex(f"{seed:016x}{steps:016x}{int(first):016x}{len(draw):016x}")
                observed[draw, first] = sanitised_projections(
                    setup, draw, first, trials, steps, secret, Path(tmp) / f"{draw}-{int(first)}"
                )

    def statistics(draw: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        def ratio(first: bool, shared: bool) -> np.ndarray:
            return mixture_log_likelihood_ratio(
                observed[draw, first], 1.0 / setup.discriminators, 2 * setup.clip, noise_std, shared
            )

        return {
            name: (ratio(True, shared), ratio(False, shared))
            for name, shared in (("a critic per row", False), ("one critic per step", True))
        }

    audits = []
    for draw, claim_of, label in (
        ("per_row", "per_row", "per_row"),
        ("per_step", "per_row", "per_step scored as T x B (the old accounting)"),
        ("per_step", "per_step", "per_step"),
    ):
        result = audit_scores(statistics(draw), setup.delta)
        claimed = setup.claimed(claim_of, steps)
        exact = QueryMechanism.gswgan_step(
            setup.discriminators, setup.batch_size, setup.noise_multiplier, draw
        ).epsilon(setup.delta, steps)
        audits.append(
            {
                "mechanism": label,
                "steps": steps,
                "epsilon_claimed": round(claimed, 4),
                "epsilon_exact": round(exact, 4),
                "epsilon_lower_bound": round(result.epsilon_lower_bound, 4),
                "claim_refuted": bool(result.epsilon_lower_bound > claimed),
                "exceeds_exact": bool(result.epsilon_lower_bound > exact),
                "trials": trials,
                "statistic": result.statistic,
                "confidence": result.confidence,
                "true_positives": result.true_positives,
                "false_positives": result.false_positives,
                "discriminators": setup.discriminators,
                "batch_size": setup.batch_size,
                "sigma": setup.noise_multiplier,
                "delta": setup.delta,
            }
        )
    return audits


# ------------------------------------------------------------------------------- calibration audits
#
# One sanitised query at a time, without subsampling, on a canary pair whose outputs differ by the whole
# sensitivity: the exact epsilon is then a Gaussian mechanism's (mu = difference / noise std), and the
# events that carry it have probability 1e-4 to 1e-3 rather than 1e-5, so 10^6 trials per input show
# most of it. A bound above the exact epsilon means the code adds less noise (or clips less) than the
# analysis assumes: `halve_noise` runs each mechanism at half its noise multiplier while it is judged
# against the exact epsilon of the intended one, and the audit must then refute it.


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon at `delta` of the Gaussian mechanism whose two outputs are mu noise standard
    deviations apart (models/privacy/exact_loss.py at sampling probability 1)."""
    from dpsynth.models.privacy.exact_loss import epsilon_at

    return epsilon_at(delta, 1.0, mu)


def _noise_multiplier(noise_multiplier: float, halve_noise: bool) -> float:
    return noise_multiplier / 2.0 if halve_noise else noise_multiplier


def _calibration_result(
    mechanism: str,
    first: np.ndarray,
    second: np.ndarray,
    exact: float,
    claimed: float,
    delta: float,
    noise_multiplier: float,
    halve_noise: bool,
    required: float,
    started: float,
    **extra: object,
) -> dict:
    """The audit of scores (higher: more likely the first input), judged against the exact epsilon: with
    the intended noise the bound must lie in [required, exact] (and the claim cover the exact epsilon);
    with half the noise it must exceed the exact epsilon."""
    result = audit_scores({"projection": (first, second)}, delta)
    bound = result.epsilon_lower_bound
    passed = bound > exact if halve_noise else required <= bound <= exact <= claimed
    n = result.trials_per_input
    return {
        "mechanism": mechanism,
        "epsilon_exact": round(exact, 4),
        "epsilon_claimed": round(claimed, 4),
        "epsilon_lower_bound": round(bound, 4),
        "trials": int(min(len(first), len(second))),
        "passed": bool(passed),
        "required_bound": None if halve_noise else round(required, 4),
        "halve_noise": halve_noise,
        "noise_multiplier": noise_multiplier,
        "noise_multiplier_run": _noise_multiplier(noise_multiplier, halve_noise),
        "exceeds_exact": bool(bound > exact),
        "claim_refuted": bool(bound > claimed),
        "threshold": round(result.threshold, 6),
        "test_trials": n,
        "true_positives": result.true_positives,
        "false_positives": result.false_positives,
        "tpr": result.true_positives / n,
        "fpr": result.false_positives / n,
        "confidence": result.confidence,
        "delta": delta,
        **extra,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _audit_secret(seed: int, mechanism: str, first: bool, halve_noise: bool) -> PrivacySecret:
    tag = int.from_bytes(mechanism.encode()[:8].ljust(8, b"\0"), "big")
    return PrivacySecret.from_hex(f"{seed:016x}{tag:016x}{int(first):016x}{int(halve_noise):016x}")


# What the generators' own calibration audits (each generator package's audit.py, listed through its
# registration: models/generators/audit_table.py) build on; models/privacy imports no generator for them.
calibration_result = _calibration_result
audit_secret = _audit_secret
noise_run = _noise_multiplier


def gswgan_sanitiser_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 1.07,
    clip: float = 1.0,
    delta: float = 1e-5,
    discriminators: int = 10,
    batch_size: int = 32,
    canary_norm: float = 10.0,
    required: float = 2.5,
    seed: int = 0,
) -> dict:
    """GS-WGAN's sanitiser through the trainer's own `generator_step`: every critic planted with the
    canary's gradient (`canary_critics`: +g on the first input, -g on the neighbour, norm `canary_norm` C
    so clipping acts), `trials` sanitised rows per input (B per step), each scored by its projection on
    g. No subsampling (every critic gives the same gradient): the exact epsilon is the Gaussian
    mechanism's with sensitivity 2C and noise 2 sigma C (mu = 1 / sigma); the claim, the accountant's
    epsilon of one sanitised row at K = 1."""
    started = time.perf_counter()
    run = StepAuditSetup(
        discriminators=discriminators,
        batch_size=batch_size,
        noise_multiplier=_noise_multiplier(noise_multiplier, halve_noise),
        clip=clip,
        delta=delta,
    )
    steps = -(-trials // batch_size)
    scores = {}
    with tempfile.TemporaryDirectory() as tmp:
        for first in (True, False):
            rows = sanitised_projections(
                run,
                "per_row",
                first,
                steps,
                1,
                _audit_secret(seed, "gswgan", first, halve_noise),
                Path(tmp) / f"input-{int(first)}",
                critics=canary_critics(run, first, canary_norm * clip),
            )
            scores[first] = rows.reshape(-1)[:trials] / clip
    exact = gaussian_epsilon(1.0 / noise_multiplier, delta)
    claimed = epsilon_for(1, 1, 1, noise_multiplier, delta)
    return _calibration_result(
        "gswgan-sanitiser",
        scores[True],
        scores[False],
        exact,
        claimed,
        delta,
        noise_multiplier,
        halve_noise,
        required,
        started,
        function="GeneratorTrainer.generator_step (query_critics, sanitize_rows)",
        discriminators=discriminators,
        batch_size=batch_size,
        steps_per_input=steps,
        canary_norm=canary_norm,
        exact_of="the Gaussian mechanism, mu = 1 / sigma",
    )


def _dpsgd_pair_note(canaries: int) -> str:
    return (
        f"{canaries} canaries per call, each in its own gradient coordinates (its trial reads only its own "
        "entries of the released gradient, which no other canary touches): one call, that many trials"
    )


def dpcgan_update_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 2.14,
    clip: float = 1.0,
    delta: float = 1e-5,
    canaries_per_call: int = 384,
    background_rows: int = 31,
    canary_norm: float = 100.0,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """One DP-SGD update of DP-CGAN's discriminator (`sanitized_gradient`: per-example gradients of a
    real network, clipped, summed, N(0, (sigma C)^2) on the real sum, from a torch.Generator). The
    discriminator has no hidden layer and zero weights, so D = 1/2 everywhere and a real row x's
    gradient is -(x, one-hot label, 1) / 2. Canary i is the row -2 n C e_i on the first input and
    +2 n C e_i on the neighbour (norm about n C, n = `canary_norm`): its clipped gradient puts +-C on
    weight i; the background rows and the fake rows are zero on the canaries' columns. Weight i of the
    released gradient is trial i. Exact: the Gaussian mechanism with mu = 2C / (sigma C)."""
    from dpsynth.models.generators.dpcgan.networks import ConditionalDiscriminator
    from dpsynth.models.generators.dpcgan.trainer import sanitized_gradient

    started = time.perf_counter()
    m, extra = canaries_per_call, 4
    public = torch.Generator().manual_seed(seed)
    disc = ConditionalDiscriminator(m + extra, ())
    with torch.no_grad():
        for p in disc.parameters():
            p.zero_()
    background = torch.zeros(background_rows, m + extra)
    background[:, m:] = torch.rand(background_rows, extra, generator=public) * 2 - 1
    background_labels = torch.randint(2, (background_rows,), generator=public)
    fake = torch.zeros(background_rows + 1, m + extra)
    fake[:, m:] = torch.rand(background_rows + 1, extra, generator=public) * 2 - 1
    fake_labels = torch.randint(2, (background_rows + 1,), generator=public)
    labels = torch.cat([torch.zeros(m, dtype=torch.int64), background_labels])
    calls = -(-trials // m)
    sigma = _noise_multiplier(noise_multiplier, halve_noise)
    scores = {}
    for first in (True, False):
        canaries = torch.eye(m, m + extra) * (2.0 * canary_norm * clip * (-1.0 if first else 1.0))
        real = torch.cat([canaries, background])
        noise_rng = _audit_secret(seed, "dpcgan", first, halve_noise).torch("dpcgan-noise")
        out = torch.empty(calls, m, dtype=torch.float64)
        for c in range(calls):
            parts = sanitized_gradient(
                disc, real, labels, fake, fake_labels, clip, sigma, float(background_rows + 1), noise_rng
            )
            out[c] = parts.total["body.0.weight"][0, :m]
        scores[first] = out.reshape(-1)[:trials].numpy() / clip
    exact = gaussian_epsilon(2.0 / noise_multiplier, delta)
    claimed = _replace_one_claim(noise_multiplier, delta)
    return _calibration_result(
        "dpcgan-update",
        scores[True],
        scores[False],
        exact,
        claimed,
        delta,
        noise_multiplier,
        halve_noise,
        0.6 * exact if required is None else required,
        started,
        function="dpsynth.models.generators.dpcgan.trainer.sanitized_gradient",
        canaries=_dpsgd_pair_note(m),
        calls_per_input=calls,
        background_rows=background_rows,
        canary_norm=canary_norm,
        exact_of="the Gaussian mechanism, mu = 2C / (sigma C)",
    )


def _replace_one_claim(noise_multiplier: float, delta: float) -> float:
    """What the DP-SGD accountant reports for one query at sampling rate 1, as replace-one."""
    from dpsynth.models.privacy.dpsgd_accountant import Phase, replace_one_epsilon

    return replace_one_epsilon(Phase(1.0, noise_multiplier, 1), delta)


def dpautogan_update_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 2.14,
    clip: float = 1.0,
    delta: float = 1e-5,
    canaries_per_call: int = 256,
    background_rows: int = 31,
    canary_norm: float = 100.0,
    spread: int = 4,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """One DP-SGD update of DP-auto-GAN (`sanitize`, what `autoencoder_update` and `critic_update` call),
    fed per-example gradients: canary i's is +-(n C / sqrt s) (e_i, ..., e_i) over s = `spread`
    parameters (norm n C, n = `canary_norm`). The clip is one joint norm over all parameters, so the
    clipped canary projects to +-C on (e_i, ..., e_i) / sqrt s; clipping each parameter on its own would
    give sqrt s C. The background rows' gradients (norms 0.5 C to 3 C) lie in one more parameter. Trial
    i: the released gradient's projection on (e_i, ..., e_i) / sqrt s. Exact: the Gaussian mechanism with
    mu = 2C / (sigma C)."""
    from dpsynth.models.generators.dpsgd import sanitize

    started = time.perf_counter()
    m = canaries_per_call
    public = torch.Generator().manual_seed(seed)
    background = torch.randn(background_rows, 8, generator=public)
    norms = torch.rand(background_rows, 1, generator=public) * 2.5 + 0.5
    background = background / background.norm(dim=1, keepdim=True) * norms * clip
    calls = -(-trials // m)
    sigma = _noise_multiplier(noise_multiplier, halve_noise)
    names = [f"layer{j}.weight" for j in range(spread)]
    scores = {}
    for first in (True, False):
        canary = torch.eye(m) * (canary_norm * clip / math.sqrt(spread) * (1.0 if first else -1.0))
        canary = torch.cat([canary, torch.zeros(background_rows, m)])
        per_example = {name: canary.clone() for name in names}
        per_example["background.weight"] = torch.cat([torch.zeros(m, 8), background])
        noise_rng = _audit_secret(seed, "dpautogan", first, halve_noise).torch("dpautogan-noise")
        out = torch.empty(calls, m, dtype=torch.float64)
        for c in range(calls):
            total = sanitize(per_example, clip, sigma, float(background_rows + 1), noise_rng).total
            out[c] = torch.stack([total[name] for name in names]).double().sum(0) / math.sqrt(spread)
        scores[first] = out.reshape(-1)[:trials].numpy() / clip
    exact = gaussian_epsilon(2.0 / noise_multiplier, delta)
    claimed = _replace_one_claim(noise_multiplier, delta)
    return _calibration_result(
        "dpautogan-update",
        scores[True],
        scores[False],
        exact,
        claimed,
        delta,
        noise_multiplier,
        halve_noise,
        0.6 * exact if required is None else required,
        started,
        function="dpsynth.models.generators.dpsgd.sanitize",
        canaries=_dpsgd_pair_note(m),
        calls_per_input=calls,
        background_rows=background_rows,
        canary_norm=canary_norm,
        parameters_per_canary=spread,
        exact_of="the Gaussian mechanism, mu = 2C / (sigma C)",
    )


def moment_vector(x: np.ndarray, binary: list[bool]) -> np.ndarray:
    """A row's statistics as the moment queries define them, computed here independently of the code
    under audit: the values, then x_i x_j for i <= j row by row, without the squares of binary columns."""
    out = list(x)
    for i in range(len(x)):
        for j in range(i, len(x)):
            if i != j or not binary[i]:
                out.append(x[i] * x[j])
    return np.asarray(out, dtype=np.float64)


def _pair_exact(
    first: np.ndarray, second: np.ndarray, binary: list[bool], noise_multiplier: float, delta: float
) -> tuple[np.ndarray, float, float]:
    """(difference of the pair's statistics, its norm over the bound, the pair's exact epsilon): every
    entry of a row's statistics is at most 1 in size, so the bound is sqrt(number of entries)."""
    v1, v2 = moment_vector(first, binary), moment_vector(second, binary)
    diff = v1 - v2
    ratio = float(np.linalg.norm(diff) / math.sqrt(len(v1)))
    return diff, ratio, gaussian_epsilon(ratio / noise_multiplier, delta)


def gaussian_fit_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 1.4,
    latent_dim: int = 4,
    flipped: int = 2,
    rows: int = 50,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
    chunk: int = 100_000,
) -> dict:
    """DP-auto-GAN's Gaussian-fit query (`fit_gaussian_latent`: `noisy_sums` of `latent_statistics`
    with `gaussian_bound`): `rows` - 1 public latents and a canary latent at a corner of [-1, 1]^d, all
    ones on the first input, the first `flipped` coordinates -1 on the neighbour (the linear and cross
    terms that change sign: the largest change between corners). `noisy_sums` sums over its first
    dimension and adds noise to every entry of the rest, so statistics repeated along a second
    dimension give `chunk` independent runs in one call. Score: the noisy sums' projection on
    v(x) - v(x'). Exact: the Gaussian mechanism with mu = ||v(x) - v(x')|| / (sigma bound), of this
    pair; the claim (replace-one, the worst pair) must cover it."""
    from dpsynth.models.generators.dpautogan.latent_gaussian import (
        gaussian_bound,
        latent_statistics,
        noisy_sums,
    )

    started = time.perf_counter()
    d = latent_dim
    public = torch.Generator().manual_seed(seed)
    background = torch.rand(rows - 1, d, generator=public, dtype=torch.float64) * 2 - 1
    canary = {True: np.ones(d), False: np.concatenate([-np.ones(flipped), np.ones(d - flipped)])}
    diff, ratio, exact = _pair_exact(canary[True], canary[False], [False] * d, noise_multiplier, delta)
    sigma = _noise_multiplier(noise_multiplier, halve_noise)
    scores = {}
    for first in (True, False):
        stats = latent_statistics(torch.cat([background, torch.from_numpy(canary[first]).unsqueeze(0)]))
        noise_rng = _audit_secret(seed, "fit", first, halve_noise).torch("dpautogan-noise")
        parts, left = [], trials
        while left > 0:
            n = min(chunk, left)
            sums = noisy_sums(stats.unsqueeze(1).expand(-1, n, -1), sigma, gaussian_bound(d), noise_rng)
            parts.append(sums.numpy() @ diff)
            left -= n
        scores[first] = np.concatenate(parts)
    claimed = _replace_one_claim(noise_multiplier, delta)
    return _calibration_result(
        "dpautogan-gaussian-fit",
        scores[True],
        scores[False],
        exact,
        claimed,
        delta,
        noise_multiplier,
        halve_noise,
        0.6 * exact if required is None else required,
        started,
        function="dpsynth.models.generators.dpautogan.latent_gaussian.noisy_sums(latent_statistics(.), sigma, "
        "gaussian_bound(d)), the query of fit_gaussian_latent",
        latent_dim=d,
        rows=rows,
        pair=[canary[True].tolist(), canary[False].tolist()],
        exact_of=f"this pair: the Gaussian mechanism, mu = ||v(x) - v(x')|| / (sigma bound) = {ratio:.4f} / sigma",
    )


def decoded_moments_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 1.5,
    rows: int = 50,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """DP-auto-GAN's decoded-moment query (`private_moments`: `moment_statistics` of the rows clipped to
    [-1, 1], `noisy_sums` with `moment_bound`), called once per trial (its statistics take rows of one
    table). Three columns, the last binary; `rows` - 1 public rows and a canary row (3, 3, 1) on the
    first input, (-3, -3, 1) on the neighbour: clipped to (+-1, +-1, 1), so a missing clip would show.
    Score: the output's projection on v(x) - v(x'). Exact: this pair's Gaussian mechanism, mu =
    ||v(x) - v(x')|| / (sigma bound)."""
    from dpsynth.models.generators.dpautogan.latent_gaussian import private_moments

    started = time.perf_counter()
    binary = [False, False, True]
    public = torch.Generator().manual_seed(seed)
    background = torch.rand(rows - 1, 3, generator=public, dtype=torch.float64) * 2 - 1
    background[:, 2] = torch.sign(background[:, 2])
    raw = {True: np.array([3.0, 3.0, 1.0]), False: np.array([-3.0, -3.0, 1.0])}
    diff, ratio, exact = _pair_exact(
        np.clip(raw[True], -1, 1), np.clip(raw[False], -1, 1), binary, noise_multiplier, delta
    )
    sigma = _noise_multiplier(noise_multiplier, halve_noise)
    scores = {}
    for first in (True, False):
        table = torch.cat([background, torch.from_numpy(raw[first]).unsqueeze(0)])
        noise_rng = _audit_secret(seed, "moments", first, halve_noise).torch("dpautogan-noise")
        out = torch.empty(trials, len(diff), dtype=torch.float64)
        for t in range(trials):
            out[t] = private_moments(table, binary, sigma, noise_rng)
        scores[first] = out.numpy() @ diff
    claimed = _replace_one_claim(noise_multiplier, delta)
    return _calibration_result(
        "dpautogan-moments",
        scores[True],
        scores[False],
        exact,
        claimed,
        delta,
        noise_multiplier,
        halve_noise,
        0.6 * exact if required is None else required,
        started,
        function="dpsynth.models.generators.dpautogan.latent_gaussian.private_moments",
        rows=rows,
        binary=binary,
        pair=[raw[True].tolist(), raw[False].tolist()],
        exact_of=f"this pair: the Gaussian mechanism, mu = ||v(x) - v(x')|| / (sigma bound) = {ratio:.4f} / sigma",
    )


def measured_marginal_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 1.07,
    rows: int = 50,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """The measured marginals' query (models/marginals/measure.py `noisy_marginal`, what `measure` runs for each
    marginal), called once per trial on a three-level column: `rows` - 1 public rows and a canary in the
    first level on the first input, in the last level on the neighbour (a replacement: one count down,
    another up). Score: the output's projection on c(x) - c(x'). Exact: the Gaussian mechanism with
    sensitivity sqrt(2) and noise sigma sqrt(2) (mu = 1 / sigma); the claim, the plan's replace-one epsilon
    of one marginal."""
    import pandas as pd

    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.models.marginals.measure import MeasurementPlan, frame_codes, noisy_marginal

    started = time.perf_counter()
    schema = DatasetSchema.from_dict(
        {
            "name": "audit",
            "target": "y",
            "columns": {
                "x": {"type": "categorical", "levels": ["a", "b", "c"]},
                "y": {"type": "binary", "levels": [0, 1]},
            },
        }
    )
    background = list(np.random.default_rng(seed).choice(["a", "b", "c"], rows - 1))
    diff = np.array([1.0, 0.0, -1.0])  # c(x) - c(x'): the canary moved from "a" to "c"
    sigma = _noise_multiplier(noise_multiplier, halve_noise)
    scores = {}
    for first in (True, False):
        frame = pd.DataFrame({"x": background + ["a" if first else "c"], "y": 0})
        codes = frame_codes(schema, frame, ["x"])
        noise = _audit_secret(seed, "marginals", first, halve_noise).numpy("marginals")
        out = np.empty((trials, 3))
        for t in range(trials):
            out[t] = noisy_marginal(codes, schema, ("x",), sigma, 20, noise)
        scores[first] = out @ diff
    exact = gaussian_epsilon(1.0 / noise_multiplier, delta)
    claimed = MeasurementPlan((("x",),), (noise_multiplier,)).epsilon(delta)
    return _calibration_result(
        "measured-marginals",
        scores[True],
        scores[False],
        exact,
        claimed,
        delta,
        noise_multiplier,
        halve_noise,
        0.6 * exact if required is None else required,
        started,
        function="dpsynth.models.marginals.measure.noisy_marginal",
        rows=rows,
        exact_of="the Gaussian mechanism, mu = sqrt(2) / (sigma sqrt(2)) = 1 / sigma",
    )


# Each called as audit(trials=..., halve_noise=..., seed=...), its other parameters left at their defaults.
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "gswgan-sanitiser": gswgan_sanitiser_audit,
    "dpcgan-update": dpcgan_update_audit,
    "dpautogan-update": dpautogan_update_audit,
    "dpautogan-gaussian-fit": gaussian_fit_audit,
    "dpautogan-moments": decoded_moments_audit,
    "measured-marginals": measured_marginal_audit,
}
CALIBRATION_MECHANISMS = tuple(CALIBRATION_AUDITS)


def calibration_audits(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    mechanisms: Sequence[str] = CALIBRATION_MECHANISMS,
    seed: int = 0,
    table: Mapping[str, Callable[..., dict]] = CALIBRATION_AUDITS,
) -> list[dict]:
    """The calibration audit of each mechanism in `mechanisms` (looked up in `table`: these six, or the
    whole list with the generators' own, models/generators/audit_table.py), `trials` per input, one
    intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [table[name](trials=trials, halve_noise=halve_noise, seed=seed) for name in mechanisms]
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------- auditing with one training run


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability of v or more correct guesses out of r (m canaries, each included with probability 1/2)
    under (epsilon, delta)-DP: Steinke, Nasr and Jagielski 2023, "Privacy auditing with one (1) training
    run", Theorem 5.2 as computed in their Appendix D."""
    from scipy.stats import binom

    if not 0 <= v <= r <= m:
        raise ValueError("need 0 <= v <= r <= m")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # the accuracy of epsilon-DP randomised response
    tail = float(binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    worst, below = 0.0, 0.0
    for i in range(1, v + 1):  # below = P[v > Binomial(r, q) >= v - i]
        below += float(binom.pmf(v - i, r, q))
        worst = max(worst, below / i)
    return min(1.0, tail + worst * delta * 2 * m)


def one_run_epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest epsilon that v correct guesses of r refute at `confidence` (0 when none is)."""
    p = 1.0 - confidence
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) >= p:
        return 0.0
    low, high = 0.0, 1.0
    while one_run_p_value(m, r, v, high, delta) < p:
        high += 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if one_run_p_value(m, r, v, middle, delta) < p:
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class TrainAuditSetup:
    """A small end-to-end audit: a generated table of `base_rows`, `canaries` extreme rows each included
    with probability 1/2, K critics, the shipped generator, `iterations` private steps (or the same with
    the sanitiser off)."""

    base_rows: int = 100
    canaries: int = 200
    discriminators: int = 1
    iterations: int = 10000
    pretrain_iterations: int = 100
    noise_multiplier: float = 1.07
    delta: float = 1e-5
    synthetic_rows: int = 100000
    guesses: int = 40  # guesses made on each side (the k+ highest and k- lowest scores)


def canary_rows(schema: DatasetSchema, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """Distinct extreme, schema-valid rows: every continuous column at one of its public bounds, every
    discrete column at a level drawn uniformly (the base table's levels are skewed towards the first)."""
    import pandas as pd

    seen: set[tuple[object, ...]] = set()
    rows: list[dict[str, object]] = []
    while len(rows) < n:
        row: dict[str, object] = {}
        for col in schema.columns:
            if col.kind == "continuous":
                row[col.name] = col.continuous_bounds[int(rng.integers(2))]
            else:
                row[col.name] = col.levels[int(rng.integers(len(col.levels)))]
        key = tuple(row.values())
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return pd.DataFrame(rows)[schema.column_names]


def train_audit(schema: DatasetSchema, setup: TrainAuditSetup, private: bool, seed: int = 0) -> dict:
    """One training run with canaries (Steinke, Nasr and Jagielski 2023): train the shipped generator on
    the table with the included canaries, score every canary by how close the synthetic rows come to it,
    guess the k highest as included and the k lowest as excluded, and turn the correct guesses into an
    epsilon lower bound at 95%. `private` False switches the sanitiser off (no clipping, no noise)."""

    import pandas as pd
    from sklearn.neighbors import NearestNeighbors

    from dpsynth.models.data.demo import make_demo_table
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.models.generators.gswgan.generator_files import sample_encoded, target_condition
    from dpsynth.models.generators.gswgan.partition import make_partition
    from dpsynth.models.generators.gswgan.pretraining import pretrain_critics
    from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer

    rng = np.random.default_rng(seed)
    encoder = TableEncoder(schema)
    base = make_demo_table(schema, setup.base_rows, seed)[schema.column_names]
    canaries = canary_rows(schema, setup.canaries, rng)
    included = rng.random(setup.canaries) < 0.5
    table = pd.concat([base, canaries[included]], ignore_index=True)
    data = torch.from_numpy(encoder.encode(table).astype(np.float32))
    gan = GanConfig(
        condition_on_target=True,
        output_head="gumbel",
        critic_refresh_steps=5,
        generator_ema=0.999,
        pretrain_iterations=setup.pretrain_iterations,
        iterations=setup.iterations,
        checkpoint_every=setup.iterations,
    )
    condition = target_condition(gan, encoder.target_index, "binary")
    secret = PrivacySecret.from_hex(f"{seed:032x}{int(private):032x}")
    partition = make_partition(len(table), setup.discriminators, secret)
    cpu = torch.device("cpu")
    critics = pretrain_critics(data, partition, gan, encoder.head_groups(), seed, cpu, condition=condition)
    privacy = PrivacyConfig(noise_multiplier=setup.noise_multiplier, delta=setup.delta)
    setting = Setting("audit", setup.discriminators, private=private)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GeneratorTrainer(
            data,
            partition,
            critics,
            gan,
            privacy,
            setting,
            encoder.head_groups(),
            seed,
            Path(tmp),
            cpu,
            secret,
            condition=condition,
        )
        trainer.run(setup.iterations)
        synthetic = sample_encoded(trainer.released_generator(), setup.synthetic_rows, seed=seed)
        claimed = trainer.accountant.get_epsilon(setup.delta) if private else math.inf
    # Score: the distance from each canary to the nearest synthetic row with the same target (the
    # synthetic table carries its labels); closest first: guessed included.
    encoded_canaries = encoder.encode(canaries)
    t = encoder.target_index
    distance = np.empty(len(canaries))
    for label in (-1.0, 1.0):
        mine = encoded_canaries[:, t] == label
        pool = synthetic[np.sign(synthetic[:, t]) == label]
        if mine.any():
            distance[mine] = NearestNeighbors(n_neighbors=1).fit(pool).kneighbors(encoded_canaries[mine])[0][:, 0]
    order = np.argsort(distance)
    k = setup.guesses
    correct = int(included[order[:k]].sum() + (~included[order[-k:]]).sum())
    return {
        "sanitiser": "on" if private else "off",
        "epsilon_claimed": claimed,
        "epsilon_lower_bound": one_run_epsilon_lower_bound(setup.canaries, 2 * k, correct, setup.delta),
        "confidence": 0.95,
        "canaries": setup.canaries,
        "included": int(included.sum()),
        "guesses": 2 * k,
        "correct": correct,
        "discriminators": setup.discriminators,
        "iterations": setup.iterations,
        "base_rows": setup.base_rows,
    }


def pooled_train_audit(runs: list[dict], delta: float) -> float:
    """One lower bound from several independent runs: their canaries and guesses together (the correct
    guesses of independent runs add up, each dominated by its binomial)."""
    m = sum(r["canaries"] for r in runs)
    return one_run_epsilon_lower_bound(m, sum(r["guesses"] for r in runs), sum(r["correct"] for r in runs), delta)
