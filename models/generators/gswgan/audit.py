"""GS-WGAN's privacy audits (`bench/audit.py`; the statistics are models/privacy/audit.py's): the step audit
(`--mode step`: T steps of the sanitised critic queries, against the accountant's claim and the exact
epsilon of the mechanism that ran), the sanitiser's calibration audit (`--mode calibration`), and the
audit with one training run (`--mode train`: canaries in the table of a whole private training)."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.networks import CriticStack
from dpsynth.models.privacy.accountant import CRITIC_DRAWS, CriticDraw, epsilon_for
from dpsynth.models.privacy.audit import (
    audit_scores,
    audit_secret,
    calibration_result,
    gaussian_epsilon,
    mixture_log_likelihood_ratio,
    noise_run,
    one_run_epsilon_lower_bound,
)
from dpsynth.models.privacy.secret import PrivacySecret

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.models.data.schema import DatasetSchema


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
        noise_multiplier=noise_run(noise_multiplier, halve_noise),
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
                audit_secret(seed, "gswgan", first, halve_noise),
                Path(tmp) / f"input-{int(first)}",
                critics=canary_critics(run, first, canary_norm * clip),
            )
            scores[first] = rows.reshape(-1)[:trials] / clip
    exact = gaussian_epsilon(1.0 / noise_multiplier, delta)
    claimed = epsilon_for(1, 1, 1, noise_multiplier, delta)
    return calibration_result(
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


# Each called as audit(trials=..., halve_noise=..., seed=...), its other parameters left at their defaults;
# listed in the audit table through GS-WGAN's registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "gswgan-sanitiser": gswgan_sanitiser_audit,
}
