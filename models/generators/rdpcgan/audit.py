"""RDP-CGAN's calibration audit (`bench/audit.py --mode calibration`; the statistics are
models/privacy/audit.py's): the trainer's own private critic update, `RDPCGANTrainer.critic_update`
(the batch, each pair's fake, the clip at `critic_clip`, the noise at `critic_noise` from the run's noise
stream, the division by the expected batch, the optimiser step), without subsampling and with the pairs'
gradients planted: canary i's pair gradient is +-(n C) e_i in the critic's flattened parameters (norm
n C, so the clip acts), the background pairs' lie in the coordinates after the canaries'. Coordinate i
of the released gradient is trial i. Exact: the Gaussian mechanism with mu = 2C / (sigma C); the claim,
the replace-one epsilon the adapter reports for one update at rate 1."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch

from dpsynth.models.privacy.audit import UpdateAudit, replace_one_claim

# A small encoded layout (a continuous, a binary and a 3-level column) and critic: the pair gradients are
# planted, so only the critic's parameter count matters (465 here: room for 256 canaries and background).
GROUPS = [(0, 1, "continuous"), (1, 2, "binary"), (2, 5, "categorical")]
CHANNELS = (8, 16)


def planted_pair_gradients(
    critic: torch.nn.Module, canaries: int, background: int, sign: float, canary_norm: float, seed: int
) -> dict[str, torch.Tensor]:
    """Per-pair gradients, per critic parameter: canary i is sign x canary_norm on flat coordinate i; the
    `background` pairs have norms 0.5 to 3 (in clip units) on the coordinates after the canaries'."""
    shapes = {name: p.shape for name, p in critic.named_parameters()}
    size = sum(s.numel() for s in shapes.values())
    if size < canaries + 1:
        raise ValueError(f"the critic has {size} parameters: too few for {canaries} canaries")
    public = torch.Generator().manual_seed(seed)
    flat = torch.zeros(canaries + background, size)
    flat[:canaries, :canaries] = torch.eye(canaries) * (sign * canary_norm)
    rest = torch.randn(background, size - canaries, generator=public)
    norms = torch.rand(background, 1, generator=public) * 2.5 + 0.5
    flat[canaries:, canaries:] = rest / rest.norm(dim=1, keepdim=True) * norms
    out, start = {}, 0
    for name, shape in shapes.items():
        out[name] = flat[:, start : start + shape.numel()].reshape(-1, *shape).clone()
        start += shape.numel()
    return out


def critic_update_audit(trials: int = 1_000_000, halve_noise: bool = False, seed: int = 0) -> dict:
    """`RDPCGANTrainer.critic_update` on a table of `canaries_per_call` + `background_rows` rows, every
    row in every batch (the trainer's rate set to 1 after it is built: no subsampling, as every
    calibration audit), the pairs' gradients planted (`planted_pair_gradients`): one call, that many
    trials."""
    from dpsynth.models.generators.rdpcgan.config import RDPCGANConfig
    from dpsynth.models.generators.rdpcgan.trainer import RDPCGANTrainer

    started = time.perf_counter()
    audit = UpdateAudit(trials, halve_noise, seed)
    m, rows = audit.canaries_per_call, audit.canaries_per_call + audit.background_rows
    config = RDPCGANConfig(
        critic_clip=audit.clip,
        critic_noise=audit.sigma,
        autoencoder_steps=1,
        generator_steps=1,
        checkpoint_every=1,
        z_dim=4,
        latent_dim=8,
        channels=CHANNELS,
    )
    with tempfile.TemporaryDirectory() as tmp:

        def scores(first: bool) -> np.ndarray:
            data = torch.zeros(rows, 5)
            trainer = RDPCGANTrainer(
                data, GROUPS, config, seed, audit.secret("rdpcgan", first), tmp, delta=audit.delta, target=(1, 2)
            )
            trainer.critic_rate, trainer.critic_divisor = 1.0, float(rows)
            planted = planted_pair_gradients(
                trainer.critic, m, audit.background_rows, 1.0 if first else -1.0, audit.canary_norm * audit.clip, seed
            )

            def pair_gradients(real: torch.Tensor, fake: torch.Tensor, mix: torch.Tensor) -> dict[str, torch.Tensor]:
                assert real.shape[0] == rows, "every row is in every batch at rate 1"
                return {k: v.clone() for k, v in planted.items()}

            trainer.critic_pair_gradients = pair_gradients  # type: ignore[method-assign]

            def release(call: int) -> torch.Tensor:
                _, parts = trainer.critic_update(call)
                return torch.cat([g.reshape(-1) for g in parts.total.values()])[:m]

            return audit.gathered(release, scale=rows)

        return audit.update_result(
            "rdpcgan-critic-update",
            scores,
            replace_one_claim(audit.noise_multiplier, audit.delta),
            started,
            function="dpsynth.models.generators.rdpcgan.trainer.RDPCGANTrainer.critic_update (pair gradients planted)",
            canaries=f"{m} canaries per call, each on its own critic coordinate",
        )


# Each called as audit(trials=..., halve_noise=..., seed=...); listed in the audit table through
# RDP-CGAN's registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {"rdpcgan-critic-update": critic_update_audit}
