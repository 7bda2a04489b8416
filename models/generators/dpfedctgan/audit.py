"""DP-Fed-CTGAN's calibration audit (`bench/audit.py --mode calibration`; the statistics are
models/privacy/audit.py's): a site's private discriminator update at the level of its per-row clip and
noise on given fakes (`local_training.sanitized_gradient`, what `SiteTrainer.discriminator_step` applies),
without subsampling. Which fakes a step draws is the public stream's business (the site's batch must not
move them); here they are fixed, so the audit sees the clip, the noise on the real sum and the division.

The discriminator has no hidden layer and zero weights, so its logit is 0 for every row and a real row
x's gradient of -log D is -(x, condition, 1) / 2. Canary i is the row -2 n C e_i on the first input and
+2 n C e_i on the neighbour (norm about n C, n = `canary_norm`): its clipped gradient puts +-C on weight
i; the background rows and the fakes are zero on the canaries' columns. Weight i of the released
gradient is trial i. Exact: the Gaussian mechanism with mu = 2C / (sigma C); the claim, the site's
replace-one epsilon of one update at rate 1 (`privacy.site_epsilon`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from dpsynth.models.privacy.audit import UpdateAudit
from dpsynth.models.privacy.dpsgd_accountant import Phase

CONDITION_WIDTH = 2  # a binary condition column's one-hot block


def client_update_audit(trials: int = 1_000_000, halve_noise: bool = False, seed: int = 0) -> dict:
    """`sanitized_gradient` of a site's update, `canaries_per_call` canaries per call (see the module
    notes), `background_rows` public real rows and as many fakes plus one, all given."""
    from dpsynth.models.generators.dpfedctgan.local_training import sanitized_gradient
    from dpsynth.models.generators.dpfedctgan.networks import ConditionalDiscriminator
    from dpsynth.models.generators.dpfedctgan.privacy import site_epsilon

    started = time.perf_counter()
    audit = UpdateAudit(trials, halve_noise, seed, canaries_per_call=384)
    m, extra, n = audit.canaries_per_call, 4, audit.background_rows
    public = torch.Generator().manual_seed(seed)
    disc = ConditionalDiscriminator(m + extra, (), CONDITION_WIDTH)
    with torch.no_grad():
        for p in disc.parameters():
            p.zero_()

    def conditions(count: int) -> torch.Tensor:
        return torch.nn.functional.one_hot(
            torch.randint(CONDITION_WIDTH, (count,), generator=public), CONDITION_WIDTH
        ).float()

    background = torch.zeros(n, m + extra)
    background[:, m:] = torch.rand(n, extra, generator=public) * 2 - 1
    fake = torch.zeros(n + 1, m + extra)
    fake[:, m:] = torch.rand(n + 1, extra, generator=public) * 2 - 1
    real_cond = torch.cat([conditions(m), conditions(n)])
    fake_cond = conditions(n + 1)
    expected_batch = float(m + n)

    def scores(first: bool) -> np.ndarray:
        canaries = torch.eye(m, m + extra) * (2.0 * audit.canary_norm * audit.clip * (-1.0 if first else 1.0))
        real = torch.cat([canaries, background])
        noise_rng = audit.secret("fedctgan", first).torch("dpfedctgan-noise")

        def release(call: int) -> torch.Tensor:
            parts = sanitized_gradient(
                disc, real, real_cond, fake, fake_cond, audit.clip, audit.sigma, expected_batch, noise_rng
            )
            return parts.total["body.0.weight"][0, :m]

        return audit.gathered(release, scale=expected_batch)

    return audit.update_result(
        "dpfedctgan-client-update",
        scores,
        site_epsilon([Phase(1.0, audit.noise_multiplier, 1)], 0.0, audit.delta),
        started,
        function="dpsynth.models.generators.dpfedctgan.local_training.sanitized_gradient (on given fakes)",
        canaries=f"{m} canaries per call, each in its own input column",
    )


# Each called as audit(trials=..., halve_noise=..., seed=...); listed in the audit table through
# DP-Fed-CTGAN's registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {"dpfedctgan-client-update": client_update_audit}
