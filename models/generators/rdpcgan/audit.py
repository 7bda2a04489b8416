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

import torch

from dpsynth.models.privacy.audit import audit_secret, calibration_result, gaussian_epsilon, noise_run
from dpsynth.models.privacy.dpsgd_accountant import Phase, replace_one_epsilon

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


def critic_update_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    noise_multiplier: float = 2.14,
    clip: float = 1.0,
    delta: float = 1e-5,
    canaries_per_call: int = 256,
    background_rows: int = 31,
    canary_norm: float = 100.0,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """`RDPCGANTrainer.critic_update` on a table of `canaries_per_call` + `background_rows` rows, every
    row in every batch (the trainer's rate set to 1 after it is built: no subsampling, as every
    calibration audit), the pairs' gradients planted (`planted_pair_gradients`): one call, that many
    trials."""
    from dpsynth.models.generators.rdpcgan.config import RDPCGANConfig
    from dpsynth.models.generators.rdpcgan.trainer import RDPCGANTrainer

    started = time.perf_counter()
    m, rows = canaries_per_call, canaries_per_call + background_rows
    calls = -(-trials // m)
    config = RDPCGANConfig(
        critic_clip=clip,
        critic_noise=noise_run(noise_multiplier, halve_noise),
        autoencoder_steps=1,
        generator_steps=1,
        checkpoint_every=1,
        z_dim=4,
        latent_dim=8,
        channels=CHANNELS,
    )
    scores = {}
    with tempfile.TemporaryDirectory() as tmp:
        for first in (True, False):
            secret = audit_secret(seed, "rdpcgan", first, halve_noise)
            data = torch.zeros(rows, 5)
            trainer = RDPCGANTrainer(data, GROUPS, config, seed, secret, tmp, delta=delta, target=(1, 2))
            trainer.critic_rate, trainer.critic_divisor = 1.0, float(rows)
            planted = planted_pair_gradients(
                trainer.critic, m, background_rows, 1.0 if first else -1.0, canary_norm * clip, seed
            )

            def pair_gradients(
                real: torch.Tensor,
                fake: torch.Tensor,
                mix: torch.Tensor,
                planted: dict[str, torch.Tensor] = planted,
            ) -> dict[str, torch.Tensor]:
                assert real.shape[0] == rows, "every row is in every batch at rate 1"
                return {k: v.clone() for k, v in planted.items()}

            trainer.critic_pair_gradients = pair_gradients  # type: ignore[method-assign]
            out = torch.empty(calls, m, dtype=torch.float64)
            for c in range(calls):
                _, parts = trainer.critic_update(c)
                out[c] = torch.cat([g.reshape(-1) for g in parts.total.values()])[:m]
            scores[first] = out.reshape(-1)[:trials].numpy() * rows / clip
    exact = gaussian_epsilon(2.0 / noise_multiplier, delta)
    return calibration_result(
        "rdpcgan-critic-update",
        scores[True],
        scores[False],
        exact,
        replace_one_epsilon(Phase(1.0, noise_multiplier, 1), delta),
        delta,
        noise_multiplier,
        halve_noise,
        0.6 * exact if required is None else required,
        started,
        function="dpsynth.models.generators.rdpcgan.trainer.RDPCGANTrainer.critic_update (pair gradients planted)",
        canaries=f"{m} canaries per call, each on its own critic coordinate",
        calls_per_input=calls,
        background_rows=background_rows,
        canary_norm=canary_norm,
        exact_of="the Gaussian mechanism, mu = 2C / (sigma C)",
    )


# Each called as audit(trials=..., halve_noise=..., seed=...); listed in the audit table through
# RDP-CGAN's registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {"rdpcgan-critic-update": critic_update_audit}
