"""DP-auto-GAN's calibration audits (`bench/audit.py --mode calibration`; the statistics are
models/privacy/audit.py's): one sanitised update as training computes it (ghost clipping), the Gaussian
latent model's one fit and its decoded-moment query, each on a canary pair, without subsampling."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from dpsynth.models.privacy.audit import Calibration, UpdateAudit, dpsgd_pair_note, gaussian_epsilon, replace_one_claim

SPREAD = 4  # the parameters each canary's gradient spreads over (the joint clip must act across them)


class CanaryNetwork(nn.Module):
    """A network whose row gradients are the audit's inputs, so that the audit runs the clipping training
    runs (models/generators/ghost_clipping.py) rather than being handed per-row gradients: `SPREAD`
    bias-free linear maps of a row's first `width` entries and one of its last 8, all summed into the row's
    loss, so row i's gradient is its first part in every one of the `SPREAD` layers and its last part in
    the "background" layer."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.layers = nn.ModuleList(nn.Linear(width, 1, bias=False) for _ in range(SPREAD))
        self.background = nn.Linear(8, 1, bias=False)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        head, tail = rows[:, : self.width], rows[:, self.width :]
        return sum((layer(head) for layer in self.layers), self.background(tail)).squeeze(1)


def dpautogan_update_audit(trials: int = 1_000_000, halve_noise: bool = False, seed: int = 0) -> dict:
    """One DP-SGD update of DP-auto-GAN as `autoencoder_update` and `critic_update` make it: the rows' clipped
    sum by `ghost_clipped_sum` (never forming per-row gradients), then `noisy_mean`. The rows are fed to
    `CanaryNetwork`, so canary i's gradient is +-(n C / sqrt s) (e_i, ..., e_i) over s = `SPREAD` parameters
    (norm n C, n = `canary_norm`). The clip is one joint norm over all parameters, so the clipped canary
    projects to +-C on (e_i, ..., e_i) / sqrt s; clipping each parameter on its own would give sqrt s C.
    The background rows' gradients (norms 0.5 C to 3 C) lie in one more parameter. Trial i: the released
    gradient's projection on (e_i, ..., e_i) / sqrt s. Exact: the Gaussian mechanism with
    mu = 2C / (sigma C)."""
    from dpsynth.models.generators.dpsgd import noisy_mean
    from dpsynth.models.generators.ghost_clipping import ghost_clipped_sum

    started = time.perf_counter()
    audit = UpdateAudit(trials, halve_noise, seed)
    m, n, clip = audit.canaries_per_call, audit.background_rows, audit.clip
    public = torch.Generator().manual_seed(seed)
    background = torch.randn(n, 8, generator=public)
    norms = torch.rand(n, 1, generator=public) * 2.5 + 0.5
    background = background / background.norm(dim=1, keepdim=True) * norms * clip
    network = CanaryNetwork(m)
    names = [f"layers.{j}.weight" for j in range(SPREAD)]

    def scores(first: bool) -> np.ndarray:
        canary = torch.eye(m) * (audit.canary_norm * clip / math.sqrt(SPREAD) * (1.0 if first else -1.0))
        rows = torch.cat([torch.cat([canary, torch.zeros(m, 8)], 1), torch.cat([torch.zeros(n, m), background], 1)])
        noise_rng = audit.secret("dpautogan", first).torch("dpautogan-noise")

        def release(call: int) -> torch.Tensor:
            summed = ghost_clipped_sum(network, lambda: network(rows), clip)
            total = noisy_mean(summed, clip, audit.sigma, float(n + 1), noise_rng).total
            return torch.stack([total[name].squeeze(0) for name in names]).double().sum(0) / math.sqrt(SPREAD)

        return audit.gathered(release)

    return audit.update_result(
        "dpautogan-update",
        scores,
        replace_one_claim(audit.noise_multiplier, delta=audit.delta),
        started,
        function="dpsynth.models.generators.ghost_clipping.ghost_clipped_sum, then dpsgd.noisy_mean",
        canaries=dpsgd_pair_note(m),
        parameters_per_canary=SPREAD,
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
    seed: int = 0,
    latent_dim: int = 4,
    flipped: int = 2,
    rows: int = 50,
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
    audit = Calibration(trials, halve_noise, seed, noise_multiplier=1.4)
    d = latent_dim
    public = torch.Generator().manual_seed(seed)
    background = torch.rand(rows - 1, d, generator=public, dtype=torch.float64) * 2 - 1
    canary = {True: np.ones(d), False: np.concatenate([-np.ones(flipped), np.ones(d - flipped)])}
    diff, ratio, exact = _pair_exact(canary[True], canary[False], [False] * d, audit.noise_multiplier, audit.delta)

    def scores(first: bool) -> np.ndarray:
        stats = latent_statistics(torch.cat([background, torch.from_numpy(canary[first]).unsqueeze(0)]))
        noise_rng = audit.secret("fit", first).torch("dpautogan-noise")
        parts, left = [], trials
        while left > 0:
            n = min(chunk, left)
            sums = noisy_sums(stats.unsqueeze(1).expand(-1, n, -1), audit.sigma, gaussian_bound(d), noise_rng)
            parts.append(sums.numpy() @ diff)
            left -= n
        return np.concatenate(parts)

    return audit.result(
        "dpautogan-gaussian-fit",
        scores,
        exact,
        replace_one_claim(audit.noise_multiplier, audit.delta),
        started,
        function="dpsynth.models.generators.dpautogan.latent_gaussian.noisy_sums(latent_statistics(.), sigma, "
        "gaussian_bound(d)), the query of fit_gaussian_latent",
        latent_dim=d,
        rows=rows,
        pair=[canary[True].tolist(), canary[False].tolist()],
        exact_of=f"this pair: the Gaussian mechanism, mu = ||v(x) - v(x')|| / (sigma bound) = {ratio:.4f} / sigma",
    )


def decoded_moments_audit(trials: int = 1_000_000, halve_noise: bool = False, seed: int = 0, rows: int = 50) -> dict:
    """DP-auto-GAN's decoded-moment query (`private_moments`: `moment_statistics` of the rows clipped to
    [-1, 1], `noisy_sums` with `moment_bound`), called once per trial (its statistics take rows of one
    table). Three columns, the last binary; `rows` - 1 public rows and a canary row (3, 3, 1) on the
    first input, (-3, -3, 1) on the neighbour: clipped to (+-1, +-1, 1), so a missing clip would show.
    Score: the output's projection on v(x) - v(x'). Exact: this pair's Gaussian mechanism, mu =
    ||v(x) - v(x')|| / (sigma bound)."""
    from dpsynth.models.generators.dpautogan.latent_gaussian import private_moments

    started = time.perf_counter()
    audit = Calibration(trials, halve_noise, seed, noise_multiplier=1.5)
    binary = [False, False, True]
    public = torch.Generator().manual_seed(seed)
    background = torch.rand(rows - 1, 3, generator=public, dtype=torch.float64) * 2 - 1
    background[:, 2] = torch.sign(background[:, 2])
    raw = {True: np.array([3.0, 3.0, 1.0]), False: np.array([-3.0, -3.0, 1.0])}
    diff, ratio, exact = _pair_exact(
        np.clip(raw[True], -1, 1), np.clip(raw[False], -1, 1), binary, audit.noise_multiplier, audit.delta
    )

    def scores(first: bool) -> np.ndarray:
        table = torch.cat([background, torch.from_numpy(raw[first]).unsqueeze(0)])
        noise_rng = audit.secret("moments", first).torch("dpautogan-noise")
        out = torch.empty(trials, len(diff), dtype=torch.float64)
        for t in range(trials):
            out[t] = private_moments(table, binary, audit.sigma, noise_rng)
        return out.numpy() @ diff

    return audit.result(
        "dpautogan-moments",
        scores,
        exact,
        replace_one_claim(audit.noise_multiplier, audit.delta),
        started,
        function="dpsynth.models.generators.dpautogan.latent_gaussian.private_moments",
        rows=rows,
        binary=binary,
        pair=[raw[True].tolist(), raw[False].tolist()],
        exact_of=f"this pair: the Gaussian mechanism, mu = ||v(x) - v(x')|| / (sigma bound) = {ratio:.4f} / sigma",
    )


# Each called as audit(trials=..., halve_noise=..., seed=...), its other parameters left at their defaults;
# listed in the audit table through DP-auto-GAN's registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "dpautogan-update": dpautogan_update_audit,
    "dpautogan-gaussian-fit": gaussian_fit_audit,
    "dpautogan-moments": decoded_moments_audit,
}
