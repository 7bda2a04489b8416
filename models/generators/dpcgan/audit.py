"""DP-CGAN's calibration audit (`bench/audit.py --mode calibration`; the statistics are
models/privacy/audit.py's): one sanitised discriminator update on a canary pair, without subsampling."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dpsynth.models.privacy.audit import (
    audit_secret,
    calibration_result,
    dpsgd_pair_note,
    gaussian_epsilon,
    noise_run,
    replace_one_claim,
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
    sigma = noise_run(noise_multiplier, halve_noise)
    scores = {}
    for first in (True, False):
        canaries = torch.eye(m, m + extra) * (2.0 * canary_norm * clip * (-1.0 if first else 1.0))
        real = torch.cat([canaries, background])
        noise_rng = audit_secret(seed, "dpcgan", first, halve_noise).torch("dpcgan-noise")
        out = torch.empty(calls, m, dtype=torch.float64)
        for c in range(calls):
            parts = sanitized_gradient(
                disc, real, labels, fake, fake_labels, clip, sigma, float(background_rows + 1), noise_rng
            )
            out[c] = parts.total["body.0.weight"][0, :m]
        scores[first] = out.reshape(-1)[:trials].numpy() / clip
    exact = gaussian_epsilon(2.0 / noise_multiplier, delta)
    claimed = replace_one_claim(noise_multiplier, delta)
    return calibration_result(
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
        canaries=dpsgd_pair_note(m),
        calls_per_input=calls,
        background_rows=background_rows,
        canary_norm=canary_norm,
        exact_of="the Gaussian mechanism, mu = 2C / (sigma C)",
    )


# Each called as audit(trials=..., halve_noise=..., seed=...), its other parameters left at their defaults;
# listed in the audit table through DP-CGAN's registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "dpcgan-update": dpcgan_update_audit,
}
