"""DP-CGAN's calibration audit (`bench/audit.py --mode calibration`; the statistics are
models/privacy/audit.py's): one sanitised discriminator update on a canary pair, without subsampling."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from dpsynth.models.privacy.audit import UpdateAudit, dpsgd_pair_note, replace_one_claim


def dpcgan_update_audit(trials: int = 1_000_000, halve_noise: bool = False, seed: int = 0) -> dict:
    """One DP-SGD update of DP-CGAN's discriminator (`sanitized_gradient`: each row's gradient of a
    real network clipped by its ghost norm, summed, N(0, (sigma C)^2) on the real sum, from a torch.Generator). The
    discriminator has no hidden layer and zero weights, so D = 1/2 everywhere and a real row x's
    gradient is -(x, one-hot label, 1) / 2. Canary i is the row -2 n C e_i on the first input and
    +2 n C e_i on the neighbour (norm about n C, n = `canary_norm`): its clipped gradient puts +-C on
    weight i; the background rows and the fake rows are zero on the canaries' columns. Weight i of the
    released gradient is trial i. Exact: the Gaussian mechanism with mu = 2C / (sigma C)."""
    from dpsynth.models.generators.dpcgan.networks import ConditionalDiscriminator
    from dpsynth.models.generators.dpcgan.trainer import sanitized_gradient

    started = time.perf_counter()
    audit = UpdateAudit(trials, halve_noise, seed, canaries_per_call=384)
    m, extra, n = audit.canaries_per_call, 4, audit.background_rows
    public = torch.Generator().manual_seed(seed)
    disc = ConditionalDiscriminator(m + extra, ())
    with torch.no_grad():
        for p in disc.parameters():
            p.zero_()
    background = torch.zeros(n, m + extra)
    background[:, m:] = torch.rand(n, extra, generator=public) * 2 - 1
    background_labels = torch.randint(2, (n,), generator=public)
    fake = torch.zeros(n + 1, m + extra)
    fake[:, m:] = torch.rand(n + 1, extra, generator=public) * 2 - 1
    fake_labels = torch.randint(2, (n + 1,), generator=public)
    labels = torch.cat([torch.zeros(m, dtype=torch.int64), background_labels])

    def scores(first: bool) -> np.ndarray:
        canaries = torch.eye(m, m + extra) * (2.0 * audit.canary_norm * audit.clip * (-1.0 if first else 1.0))
        real = torch.cat([canaries, background])
        noise_rng = audit.secret("dpcgan", first).torch("dpcgan-noise")

        def release(call: int) -> torch.Tensor:
            parts = sanitized_gradient(
                disc, real, labels, fake, fake_labels, audit.clip, audit.sigma, float(n + 1), noise_rng
            )
            return parts.total["body.0.weight"][0, :m]

        return audit.gathered(release)

    return audit.update_result(
        "dpcgan-update",
        scores,
        replace_one_claim(audit.noise_multiplier, audit.delta),
        started,
        function="dpsynth.models.generators.dpcgan.trainer.sanitized_gradient",
        canaries=dpsgd_pair_note(m),
    )


# Each called as audit(trials=..., halve_noise=..., seed=...), its other parameters left at their defaults;
# listed in the audit table through DP-CGAN's registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "dpcgan-update": dpcgan_update_audit,
}
