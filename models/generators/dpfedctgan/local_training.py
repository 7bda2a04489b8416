"""One site's share of a federated round: from the round's global weights, `local_steps` DP-SGD updates
of the discriminator on the site's rows, each followed by one generator step; the new weights go back to
the server.

The sanitised gradient is DP-CGAN's (models/generators/dpcgan/trainer.py): per-row gradients of the real
rows and of the generated rows clipped separately to C, Gaussian noise N(0, (sigma C)^2) on the real sum
only (the generated rows do not read the data), the whole divided by the expected batch q n_site. n_site
is the site's *noisy* row count (conditions.py), so nothing but DP outputs shapes an update. Each
discriminator update is one composition of the sampled Gaussian at the site's rate q: the site counts
them (`updates`) and reports each round's count, which the server's accountant for the site records
(federation/server.py). The site keeps no accountant itself, so its process never imports the RDP
analysis (scipy): that would slow every site's start.

A site keeps nothing between rounds: its Adam states start afresh each round (FedAvg averages weights
only), and each round's random streams are derived from the round's number (Poisson batches and noise
from the site's secret, latents and condition columns from the profile seed). A client that restarts, or
a run that resumes from the last completed round, therefore computes exactly what it would have.

The public stream advances by the same count in every update whatever the Poisson batch drew: the real
rows' condition columns are counter-based draws keyed by (round, step, row's position), not draws from
the stream. Were they drawn from it, the fakes and the generator step after them would change with the
batch's size, so under a neighbouring table the fake half of the gradient would differ too, which the
accountant's derivation (one row's clipped gradient plus noise) does not allow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.models.generators.dpfedctgan.conditions import condition_key
from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.generators.dpfedctgan.networks import (
    ConditionalDiscriminator,
    ConditionalGenerator,
    FedGeneratorSpec,
)
from dpsynth.models.generators.dpsgd import (
    apply_gradient,
    gaussian_noise,
    per_example_gradients,
    poisson_batch,
)
from dpsynth.models.generators.ghost_clipping import discriminator_clipped_sum
from dpsynth.models.privacy.secret import PrivacySecret


def per_sample_gradients(
    disc: ConditionalDiscriminator, rows: torch.Tensor, cond: torch.Tensor, real: bool
) -> dict[str, torch.Tensor]:
    """Each row's gradient of its own loss (real: -log D; generated: -log(1 - D)), per parameter name."""
    target = torch.tensor(1.0 if real else 0.0, dtype=rows.dtype)

    def loss_one(params: dict[str, torch.Tensor], row: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        logit = functional_call(disc, params, (row.unsqueeze(0), c.unsqueeze(0)))
        return F.binary_cross_entropy_with_logits(logit.squeeze(0), target)

    return per_example_gradients(disc, loss_one, rows, cond)


@dataclass
class SanitizedGradient:
    """One discriminator update's gradient parts, per parameter name: `total` = (real_sum + noise +
    fake_sum) / expected_batch is what the optimiser applies."""

    real_sum: dict[str, torch.Tensor]
    noise: dict[str, torch.Tensor]
    fake_sum: dict[str, torch.Tensor]
    total: dict[str, torch.Tensor]


def sanitized_gradient(
    disc: ConditionalDiscriminator,
    real: torch.Tensor,
    real_cond: torch.Tensor,
    fake: torch.Tensor,
    fake_cond: torch.Tensor,
    clip: float,
    noise_multiplier: float,
    expected_batch: float,
    noise_rng: torch.Generator | None,
) -> SanitizedGradient:
    # Each row's gradient (per_sample_gradients) clipped and summed without forming it: ghost_clipping.py.
    real_sum = discriminator_clipped_sum(disc, real, real_cond, True, clip)
    fake_sum = discriminator_clipped_sum(disc, fake.detach(), fake_cond, False, clip)
    noise = gaussian_noise(real_sum, noise_multiplier * clip, noise_rng)
    total = {k: (real_sum[k] + noise[k] + fake_sum[k]) / expected_batch for k in real_sum}
    return SanitizedGradient(real_sum, noise, fake_sum, total)


def public_seed(seed: int, site: int, round_index: int) -> int:
    """The seed of a site's public random choices in one round (latents, condition columns)."""
    return (int(seed) * 1_000_003 + int(site) * 10_007 + int(round_index)) % (2**63)


class SiteTrainer:
    """A site's local training. `rows`: the site's encoded rows; `shares`: the conditional vector's noisy
    global level shares; `noisy_size`: the site's noisy row count (the expected batch's n)."""

    def __init__(
        self,
        rows: torch.Tensor,
        spec: FedGeneratorSpec,
        config: DPFedCTGANConfig,
        *,
        seed: int,
        site: int,
        secret: PrivacySecret,
        shares: torch.Tensor,
        noisy_size: float,
    ):
        self.rows, self.spec, self.config = rows.float(), spec, config
        self.seed, self.site, self.secret, self.shares = int(seed), int(site), secret, shares
        self.layout = spec.layout
        self.expected_batch = config.sample_rate * max(float(noisy_size), 1.0)
        self.fake_rows = max(1, round(self.expected_batch))
        self.generator: ConditionalGenerator = spec.build()
        self.discriminator = spec.build_discriminator(config.discriminator_hidden)
        self.updates = 0  # sanitised discriminator updates taken: compositions at the site's (q, sigma)

    def load(self, generator_state: dict[str, torch.Tensor], discriminator_state: dict[str, torch.Tensor]) -> None:
        self.generator.load_state_dict(generator_state)
        self.discriminator.load_state_dict(discriminator_state)

    def draw_fake(self, n_rows: int, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        cond = self.layout.sampled_conditions(n_rows, self.shares, rng)
        z, noise = self.generator.draw_inputs(n_rows, rng)
        return self.generator(z, cond, noise), cond

    def discriminator_step(
        self, optimizer: torch.optim.Optimizer, streams: RoundStreams, step: int
    ) -> tuple[int, SanitizedGradient]:
        """Private update `step` of the round; returns the drawn batch size (internal only) and the
        gradient's parts. The public stream advances by the fakes' fixed count only: the real rows'
        conditions are drawn by position (`condition_key`), so the fakes do not depend on the batch."""
        index = poisson_batch(self.rows.shape[0], self.config.sample_rate, streams.sampling)
        real = self.rows[index]
        real_cond = self.layout.real_conditions(real, index, condition_key(streams.condition_seed, step))
        with torch.no_grad():
            fake, fake_cond = self.draw_fake(self.fake_rows, streams.public)
        parts = sanitized_gradient(
            self.discriminator,
            real,
            real_cond,
            fake,
            fake_cond,
            self.config.clip,
            self.config.noise_multiplier,
            self.expected_batch,
            streams.noise,
        )
        apply_gradient(self.discriminator, parts.total, optimizer)
        self.updates += 1
        return int(index.numel()), parts

    def generator_step(self, optimizer: torch.optim.Optimizer, streams: RoundStreams) -> float:
        """An ordinary step (post-processing: it reads the discriminator on generated rows only)."""
        fake, cond = self.draw_fake(self.fake_rows, streams.public)
        logits = self.discriminator(fake, cond)
        loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
        optimizer.zero_grad(set_to_none=True)
        self.discriminator.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        self.discriminator.zero_grad(set_to_none=True)  # not a sanitised gradient: never applied
        return float(loss.detach())

    def run_round(self, round_index: int) -> int:
        """`local_steps` (discriminator, generator) steps from the loaded weights; returns the sanitised
        updates taken (what the server's accountant for the site records for this round)."""
        c = self.config
        streams = RoundStreams.for_round(self.secret, self.seed, self.site, round_index)
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=c.lr_discriminator, betas=c.betas)
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=c.lr_generator, betas=c.betas)
        before = self.updates
        for step in range(c.local_steps):
            self.discriminator_step(opt_d, streams, step)
            self.generator_step(opt_g, streams)
        return self.updates - before


@dataclass
class RoundStreams:
    sampling: torch.Generator  # Poisson batches: the site's secret
    noise: torch.Generator  # Gaussian noise: the site's secret
    public: torch.Generator  # latents and generated conditions: the profile seed, a fixed count per update
    condition_seed: int  # the key of the real rows' condition columns (counter-based, by position)

    @classmethod
    def for_round(cls, secret: PrivacySecret, seed: int, site: int, round_index: int) -> RoundStreams:
        public = public_seed(seed, site, round_index)
        return cls(
            secret.torch(f"dpfedctgan-sampling-round-{round_index}"),
            secret.torch(f"dpfedctgan-noise-round-{round_index}"),
            torch.Generator().manual_seed(public),
            public,
        )


def site_counts_stream(secret: PrivacySecret) -> np.random.Generator:
    """The site's one stream for its noisy counts (drawn once: a rerun sends the same numbers)."""
    return secret.numpy("dpfedctgan-counts")
