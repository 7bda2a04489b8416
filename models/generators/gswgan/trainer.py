"""GS-WGAN's Algorithm 2: the generator trained through the sanitised gradients of the critics its rows
query, with checkpoints that resume exactly.

Randomness. Training draws the critics each sanitised row queries and the sanitiser's noise from the
secret's "training" stream, and everything else (batches, latents: z, labels and head noise; gradient
penalty weights) from one seeded CPU `torch.Generator`; both states are checkpointed, so a resumed run
ends exactly as an uninterrupted one.

Speed (bench/train.py). A step refreshes its refresh slots' critics in place in the stack, all against
the same r fake batches made in one pass, queries each generated row through its own critic (gathered
parameters, one batched product), and steps G's fused Adam directly (fused_adam.py); it uses one
intra-op thread (`threads`), and the C refresh (models/native/kernels.py, chosen in devices.py) splits a
step's refreshed critics over `refresh_workers` threads (each core it may use).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth.models.checkpoint_files import (
    resume_state,
    save_training_state,
    save_verified,
    write_text_atomic,
)
from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.generators.gswgan.config import GanConfig, discriminators
from dpsynth.models.generators.gswgan.devices import intra_op_threads
from dpsynth.models.generators.gswgan.fused_adam import FusedAdamStep
from dpsynth.models.generators.gswgan.generator_files import GeneratorSpec, generator_spec, sample_encoded
from dpsynth.models.generators.gswgan.partition import sample_local_rows, subset_sizes
from dpsynth.models.generators.networks import (
    CriticStack,
    Generator,
    HeadGroup,
    StackedAdam,
    Workspace,
    init_generator_,
)
from dpsynth.models.generators.sanitizer import sanitize_rows
from dpsynth.models.native.kernels import CriticRows, critic_input_grads, critic_updates, use_native_critics
from dpsynth.models.privacy.accountant import GSWGANAccountant
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"
# Split a step's critic refresh over threads only from this critic size (input width x hidden units) on:
# measured per step with K = 1000, B = 32, r = 5, hidden 128: 16 columns 5.6 -> 6.0 ms (the handoff costs
# more than it saves), 40 columns 9.3 -> 8.4, 64 columns 12.8 -> 10.3, 128 columns 29 -> 20.
SPLIT_REFRESH_MIN = 32 * 128


@dataclass
class TrainingResult:
    """What `GeneratorTrainer.run` returns: the ledger's checkpoints, whether the run ended before the
    section's last iteration, its seconds and the internal metrics."""

    checkpoints: list[dict[str, Any]]
    stopped_by_budget: bool
    seconds: float
    metrics: list[dict[str, Any]] = field(default_factory=list)


def _first_slots(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct critics in `slots` (sorted) and, for each, the first slot that names it."""
    drawn, inverse = torch.unique(slots, return_inverse=True)
    positions = torch.arange(slots.numel(), dtype=torch.int64)
    first = torch.full((drawn.numel(),), slots.numel(), dtype=torch.int64).scatter_reduce_(
        0, inverse, positions, reduce="amin"
    )
    return drawn, first


def _asked(estimates: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """The critics' Wasserstein estimates, every one present when they were asked for."""
    return [e for e in estimates if e is not None]


class GeneratorTrainer:
    """Algorithm 2 with checkpointing. `run()` resumes from `checkpoint_dir/training_state.pt` if present.

    Every generator step queries the critics through the sanitiser, and how it draws them is the
    mechanism the accountant composes (`gan.critic_draw`, models/privacy/accountant.py):

    * "per_row": each of the B generated rows draws its own critic, uniformly and independently
      (collisions allowed).
    * "per_step": the thesis' Algorithm 2, one critic per step for all B rows. Accounted as what it is,
      T queries at noise sigma / sqrt(B).

    Before the query, the critics of the step's refresh slots (`draw_refreshed`: as many as it queries,
    from their own secret stream under `critic_refresh: independent`, or the queried ones under
    "drawn") get `critic_refresh_steps` updates (default `critic_steps`) against the current generator,
    all of them in one batched call. Critics are never released, and an independent schedule keeps
    every critic's state free of past query draws (docs/privacy.md section 1).

    Randomness: the critic draws and the sanitiser's noise come from `secret` (stream "training"), the
    refresh schedule from its stream "critic-refresh",
    everything else (initialisation, latents, the critics' batches, gradient-penalty weights) from
    `seed`. Both generators' states are checkpointed, so a resumed run ends exactly as an
    uninterrupted one.
    """

    def __init__(
        self,
        data: torch.Tensor,
        partition: np.ndarray,
        critics: CriticStack,
        gan: GanConfig,
        privacy: PrivacyConfig,
        setting: Setting,
        groups: Sequence[HeadGroup],
        seed: int,
        checkpoint_dir: Path,
        device: torch.device,
        secret: PrivacySecret,
        level_share_fn: Callable[[np.ndarray], dict[str, Any]] | None = None,
        threads: int | None = 1,
        condition: tuple[int, float] | None = None,
        refresh_workers: int | None = None,
        marginals_rho: float = 0.0,
    ) -> None:
        self.gan, self.privacy, self.setting = gan, privacy, setting
        # The measured marginals' replace-one zCDP (models/marginals/release.py): they read the same rows,
        # so every checkpoint's epsilon is the conversion of training's curve plus theirs.
        self.marginals_rho = marginals_rho
        # Intra-op threads while `run` trains on CPU: one iteration is many small operations on batches
        # of B rows, which a single thread runs fastest (and other processes cannot stall it).
        self.threads = threads
        # Threads for the C critic refresh (drawn critics are independent): every core this process may
        # use (torch's count before `run` narrows it; 1 in the experiment's one-thread workers).
        self.refresh_workers = max(1, refresh_workers if refresh_workers is not None else torch.get_num_threads())
        self._pool: ThreadPoolExecutor | None = None
        self.device = device
        self.data = data.to(device)
        self.partition = torch.as_tensor(partition, device=device)
        self.sizes = subset_sizes(self.partition)
        self.critics = critics
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = torch.Generator().manual_seed(seed)
        self.privacy_rng = secret.torch("training")
        # The refresh schedule's own stream: independent of the query draws (`draw_refreshed`).
        self.refresh_rng = secret.torch("critic-refresh")
        self.size_bounds = (int(self.sizes.min()), int(self.sizes.max()))
        self.spec: GeneratorSpec = generator_spec(gan, data.shape[1], groups, condition)
        self.generator = self.spec.build()
        init_generator_(self.generator, gan.init, self.rng)
        self.generator.to(device)
        self.ema: Generator | None = None
        self._ema_weight = 0.0  # the share of G's weights in every update of the EMA: 1 - decay
        if gan.generator_ema is not None:
            self.ema = self.spec.build().to(device)
            self.ema.load_state_dict(self.generator.state_dict())
            self._ema_weight = 1.0 - gan.generator_ema
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=gan.lr_generator, betas=gan.betas, fused=True)
        self._gen_params: list[torch.Tensor] = list(self.generator.parameters())
        self._gen_buffers = list(self.generator.buffers())
        self._step_g = FusedAdamStep(self.opt_g, self._gen_params)
        self._ws = Workspace()
        if self.ema is not None:
            self._ema_params: list[torch.Tensor] = list(self.ema.parameters())
            self._ema_buffers = list(self.ema.buffers())
        # A fresh Adam per critic for the training phase, as in the official GS-WGAN code.
        self.opt_d = StackedAdam(critics.trainable(critics.params), gan.lr_critic, gan.betas)
        self.native_critics = use_native_critics(gan.kernels, critics.params[0].shape[-1], critics.batchnorm, device)
        self.accountant = GSWGANAccountant(
            discriminators(setting), gan.batch_size, privacy.noise_multiplier, gan.critic_draw
        )
        self.iteration = 0
        self.ledger: list[dict[str, Any]] = []
        self.resume_notes: list[str] = []
        self.metrics: list[dict[str, Any]] = []
        self.level_share_fn = level_share_fn

    @property
    def refresh_steps(self) -> int:
        """Critic updates each drawn critic gets per generator step."""
        return self.gan.critic_refresh_steps or self.gan.critic_steps

    # -- one iteration ---------------------------------------------------------------------------
    def draw_critics(self) -> torch.Tensor:
        """The critic each of the B sanitised rows of the next step queries ([B], from the secret)."""
        k, b = self.partition.shape[0], self.gan.batch_size
        if self.gan.critic_draw == "per_row":
            return torch.randint(k, (b,), generator=self.privacy_rng)
        return torch.randint(k, (1,), generator=self.privacy_rng).expand(b)

    def draw_refreshed(self, drawn: torch.Tensor) -> torch.Tensor:
        """The refresh slots of the next step: as many critics as it queries (B for per_row, 1 for
        per_step), collisions allowed. "independent": uniform draws from the refresh schedule's own
        stream, so a critic's state depends on the data, the released steps and this schedule, never
        on which critics past rows queried; "drawn": the queried critics themselves (`drawn`)."""
        slots = drawn if self.gan.critic_draw == "per_row" else drawn[:1]
        if self.gan.critic_refresh == "drawn":
            return slots
        return torch.randint(self.partition.shape[0], (slots.numel(),), generator=self.refresh_rng)

    def refresh_critics(self, slots: torch.Tensor | int, wasserstein: bool = False) -> float | None:
        """`refresh_steps` updates of each critic named in `slots` (once per critic, however many slots
        name it) on batches of its own subset, all against the same fake batches of the current
        generator (not sanitised: critics are never released). Every slot draws its batches and penalty
        weights from the seeded stream, used or not, so that stream advances by the same amount every
        step. Returns the mean over the critics of the estimate mean D(real) - mean D(fake) at their last
        update, when asked."""
        r, b = self.refresh_steps, self.gan.batch_size
        slots = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
        z = self.generator.latent(r * b, self.rng).to(self.device)
        local = sample_local_rows(self.sizes[slots], b, self.rng, (slots.numel(), r), self.size_bounds)
        alpha = torch.rand(slots.numel(), r, b, 1, generator=self.rng)
        drawn, first = _first_slots(slots)
        return self._update_critics(drawn, local[first], alpha[first], z, wasserstein)

    def _update_critics(
        self, drawn: torch.Tensor, local: torch.Tensor, alpha: torch.Tensor, z: torch.Tensor, wasserstein: bool = False
    ) -> float | None:
        """local.shape[1] updates of each critic in `drawn` (distinct), in place in the stack, on the rows
        `local` [u, r, B] of its subset and fakes G(z) (r batches of B), penalty weights `alpha`."""
        u, r, b = local.shape
        local, alpha = local.to(self.device), alpha.to(self.device)
        # G does not change during the refresh: one pass makes the r fake batches (r training-mode calls:
        # BatchNorm statistics and running statistics as r separate calls), shared by every drawn critic.
        fakes = self.generator.forward_chunks(z, r).view(r, b, -1)
        drawn = drawn.to(self.device)
        rows = torch.gather(self.partition[drawn], 1, local.reshape(u, r * b))
        if self.native_critics:
            # All updates of every drawn critic in C, in place in the stack (models/native/kernels.py),
            # reading the real rows by index and the shared fake batches where they lie.
            source = CriticRows(self.data, rows.view(u, r, b), fakes, shared=True)
            index = drawn.cpu().numpy()
            estimate = self._native_updates(source, alpha, index, wasserstein)
            self.opt_d.steps[index] += r
            return float(estimate.mean()) if estimate is not None else None
        real = self.data[rows].view(u, r, b, -1)
        estimates = [self._refresh_one(int(k), real[i], fakes, alpha[i], wasserstein) for i, k in enumerate(drawn)]
        return float(torch.stack(_asked(estimates)).mean()) if wasserstein else None

    def _native_updates(
        self, source: CriticRows, alpha: torch.Tensor, index: np.ndarray, wasserstein: bool
    ) -> torch.Tensor | None:
        """The C updates of the critics at `index` (distinct), split over `refresh_workers` threads: each
        critic's updates are independent of the others', so the split changes no number (the C call
        releases the GIL)."""

        def updates(part: slice) -> torch.Tensor | None:
            return critic_updates(
                self.critics.params,
                self.opt_d.exp_avg,
                self.opt_d.exp_avg_sq,
                self.opt_d.steps[index[part]],
                source.part(part),
                alpha[part],
                self.opt_d.lr,
                self.opt_d.betas,
                self.opt_d.eps,
                self.gan.gp_lambda,
                wasserstein,
                index=index[part],
            )

        width, hidden = self.critics.params[0].shape[-2:]
        workers = min(self.refresh_workers, index.size) if width * hidden >= SPLIT_REFRESH_MIN else 1
        if workers <= 1:
            return updates(slice(None))
        bounds = np.linspace(0, index.size, workers + 1).round().astype(int)
        parts = [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.refresh_workers - 1, thread_name_prefix="critics")
        # The calling thread takes the last part itself rather than waiting idle for the pool.
        others = [self._pool.submit(updates, part) for part in parts[:-1]]
        last = updates(parts[-1])
        estimates = [f.result() for f in others] + [last]
        return torch.cat(_asked(estimates)) if wasserstein else None

    def _refresh_one(
        self, k: int, real: torch.Tensor, fakes: torch.Tensor, alpha: torch.Tensor, wasserstein: bool
    ) -> torch.Tensor | None:
        """The tensor code's updates of critic k (the reference of the C kernels): real, fakes [r, B, d]."""
        gan, r = self.gan, real.shape[0]
        critics = self.critics
        params = [p[k : k + 1] for p in critics.params]  # views: updated in place
        train = critics.trainable(params)
        moments = self.opt_d.moments(k)
        estimate = None
        alphas = alpha.split(1)
        if critics.batchnorm:
            reals, fakes_ = real.split(1), fakes.split(1)
        else:
            x_rf = torch.cat([real, fakes], 1)
            rows, weighted = x_rf.split(1), critics.weighted_rows(x_rf).split(1)
        for s in range(r):
            last = wasserstein and s == r - 1
            if critics.batchnorm:
                grads, w = critics.loss_grads(params, reals[s], fakes_[s], alphas[s], gan.gp_lambda, last)
            else:
                grads, w = critics.loss_grads_rows(
                    params, rows[s], weighted[s], alphas[s], gan.gp_lambda, last, self._ws
                )
            self.opt_d.step_one(k, train, grads, moments)
            if last:
                estimate = w[0]
        return estimate

    def query_critics(self, fake: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
        """Row i's gradient of -D_{drawn[i]}(rows) with respect to row i, for generated rows [B, d]: each
        row through its own (frozen) critic. With BatchNorm critics a critic scores the whole batch of
        generated rows (public: they come from G), and row i takes its gradient of that critic's sum."""
        critics = self.critics
        if bool((drawn == drawn[0]).all()):
            params = [p[int(drawn[0]) : int(drawn[0]) + 1] for p in critics.params]
            return critics.input_grad(params, fake.unsqueeze(0), self._ws).squeeze(0).neg_()
        drawn = drawn.to(self.device)
        if self.native_critics:
            return critic_input_grads(critics.params, drawn, fake).neg_()
        params = [p.index_select(0, drawn) for p in critics.params]
        if critics.batchnorm:
            b = fake.shape[0]
            grads = critics.input_grad(params, fake.unsqueeze(0).expand(b, b, fake.shape[1]))
            return grads[torch.arange(b), torch.arange(b)].neg_()
        return critics.input_grad(params, fake.unsqueeze(1), self._ws).squeeze(1).neg_()

    def generator_step(self, drawn: torch.Tensor | int) -> torch.Tensor:
        """One generator step, row i querying critic drawn[i] (an int: every row critic `drawn`); returns
        the (sanitised) upstream gradient."""
        gan = self.gan
        drawn = torch.as_tensor(drawn, dtype=torch.int64).reshape(-1).expand(gan.batch_size)
        z = self.generator.latent(gan.batch_size, self.rng).to(self.device)
        fake = self.generator(z)
        # Cut the graph at the generated rows: the critics reach G only through this tensor, the
        # gradient of the loss -D(row) with respect to each row.
        upstream = self.query_critics(fake.detach(), drawn)
        if self.spec.condition is not None:
            # A conditional generator's label column is an input, not generated: it takes no gradient
            # and no share of the clipping norm.
            upstream[:, self.spec.condition[0]] = 0.0
        if self.setting.private:
            upstream = sanitize_rows(upstream, self.privacy.clip, self.privacy.noise_multiplier, self.privacy_rng)
        for p in self._gen_params:
            p.grad = None
        fake.backward(upstream / gan.batch_size)
        self._step_g()
        if self.ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(self._ema_params, self._gen_params, self._ema_weight)
                torch._foreach_copy_(self._ema_buffers, self._gen_buffers)
        return upstream

    def step(self, wasserstein: bool = True) -> float | None:
        """One iteration: draw the step's critics and its refresh slots, refresh those, one sanitised
        generator step."""
        drawn = self.draw_critics()
        estimate = self.refresh_critics(self.draw_refreshed(drawn), wasserstein)
        self.generator_step(drawn)
        if self.setting.private:
            self.accountant.step()
        self.iteration += 1
        return estimate

    # -- checkpoints ------------------------------------------------------------------------------
    def released_generator(self) -> Generator:
        return self.ema if self.ema is not None else self.generator

    def _epsilon(self) -> float:
        if not self.setting.private:
            return math.inf
        return self.accountant.get_epsilon(self.privacy.delta, self.marginals_rho)

    def _save_checkpoint(self) -> None:
        it = self.iteration
        gen_file = self.dir / f"generator_{it:06d}.pt"
        epsilon = self._epsilon()
        digest = save_verified(
            {
                "spec": self.spec.to_dict(),
                "state_dict": self.released_generator().state_dict(),
                "iteration": it,
                "epsilon": epsilon,
                "delta": self.privacy.delta,
            },
            gen_file,
        )
        entry: dict[str, Any] = {"iteration": it, "epsilon": epsilon, "generator": gen_file.name, "sha256": digest}
        if self.level_share_fn is not None:
            entry["level_shares"] = self.level_share_fn(sample_encoded(self.released_generator(), 2000, seed=it))
        self.ledger = [e for e in self.ledger if e["iteration"] < it] + [entry]
        state = {
            "iteration": it,
            "generator": self.generator.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "opt_g": self.opt_g.state_dict(),
            "critics": self.critics.state_dict(),
            "opt_d": self.opt_d.state_dict(),
            "accountant": self.accountant.state_dict(),
            "rng": self.rng.get_state(),
            "privacy_rng": self.privacy_rng.get_state(),
            "refresh_rng": self.refresh_rng.get_state(),
            "ledger": self.ledger,
            "metrics": self.metrics,
        }
        save_training_state(state, self.dir / STATE_FILE)
        write_text_atomic(
            json.dumps(
                {
                    "mechanism": self.accountant.mechanism if self.setting.private else None,
                    "critic_draw": self.gan.critic_draw,
                    "checkpoints": self.ledger,
                },
                indent=1,
            ),
            self.dir / LEDGER_FILE,
        )

    def _load_state(self) -> bool:
        """Resume from the newest intact training state (the latest, else the one before it); records in
        `resume_notes` what was damaged and where training resumed."""
        state, self.resume_notes = resume_state(self.dir / STATE_FILE, "iteration")
        if state is None:
            return False
        self.iteration = state["iteration"]
        self.generator.load_state_dict(state["generator"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        self.opt_g.load_state_dict(state["opt_g"])
        self._step_g.sync()
        self.critics.load_state_dict(state["critics"])
        self.opt_d.load_state_dict(state["opt_d"], self.device)
        self.accountant.load_state_dict(state["accountant"])
        self.rng.set_state(state["rng"])
        self.privacy_rng.set_state(state["privacy_rng"])
        self.refresh_rng.set_state(state["refresh_rng"])
        self.ledger = state["ledger"]
        self.metrics = state["metrics"]
        return True

    def run(
        self,
        last_iteration: int,
        stop_after: int | None = None,
        progress: Callable[[int, float], None] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> TrainingResult:
        """Train to `last_iteration`, checkpointing every `checkpoint_every`. `stop_after` ends the call
        early after that many iterations (used to simulate an interruption). `progress(iteration,
        epsilon)` is called at every checkpoint; `on_step(iteration)` once with the iteration training
        starts (or resumes) from, then after every iteration."""
        start = time.perf_counter()
        if not self._load_state():
            self._save_checkpoint()  # iteration 0: the untrained generator costs no privacy
        with intra_op_threads(self.threads if self.device.type == "cpu" else None):
            self._train_to(last_iteration, stop_after, progress, on_step)
        return TrainingResult(
            list(self.ledger), last_iteration < self.gan.iterations, time.perf_counter() - start, list(self.metrics)
        )

    def _train_to(
        self,
        last_iteration: int,
        stop_after: int | None,
        progress: Callable[[int, float], None] | None,
        on_step: Callable[[int], None] | None,
    ) -> None:
        done = 0
        self.generator.train()
        if on_step is not None:
            on_step(self.iteration)
        while self.iteration < last_iteration:
            if stop_after is not None and done >= stop_after:
                break
            at_checkpoint = (self.iteration + 1) % self.gan.checkpoint_every == 0
            wasserstein = self.step(wasserstein=at_checkpoint)
            done += 1
            if self.iteration % self.gan.checkpoint_every == 0:
                # Internal only: derived from real rows through the critic.
                self.metrics.append({"iteration": self.iteration, "critic_wasserstein": wasserstein})
                self._save_checkpoint()
                if progress is not None:
                    progress(self.iteration, self._epsilon())
            if on_step is not None:
                on_step(self.iteration)
