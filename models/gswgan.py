"""GS-WGAN for tables: partition, batched critic pretraining (Algorithm 1) and private generator
training (Algorithm 2) with checkpoints that resume exactly.

Every random choice is drawn from one seeded CPU `torch.Generator` whose state is checkpointed, so a
resumed run ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from models.accountant import MECHANISM, GSWGANAccountant, epsilons_at
from models.config import GanConfig, PrivacyConfig, Setting
from models.errors import BudgetExceededError, ConfigError
from models.networks import CriticStack, Generator, GeneratorStack, StackedAdam, init_generator_
from models.sanitizer import sanitize_rows

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def make_partition(n_rows: int, discriminators: int, seed: int) -> np.ndarray:
    """Shuffle rows once with the seed and cut K disjoint subsets of floor(n/K) rows (leftovers dropped)."""
    size = n_rows // discriminators
    if size < 1:
        raise ConfigError(f"{n_rows} training rows cannot be split among {discriminators} discriminators.")
    order = np.random.default_rng(seed).permutation(n_rows)
    return order[: size * discriminators].reshape(discriminators, size)


@dataclass(frozen=True)
class GeneratorSpec:
    """Everything needed to rebuild a generator for sampling, stored beside its weights."""

    z_dim: int
    hidden: tuple[int, ...]
    out_width: int
    head: str
    groups: tuple[tuple[int, int], ...]

    def build(self) -> Generator:
        return Generator(self.z_dim, self.hidden, self.out_width, self.head, [tuple(g) for g in self.groups])

    @classmethod
    def from_dict(cls, d: dict) -> "GeneratorSpec":
        return cls(d["z_dim"], tuple(d["hidden"]), d["out_width"], d["head"], tuple(tuple(g) for g in d["groups"]))

    def to_dict(self) -> dict:
        return {"z_dim": self.z_dim, "hidden": list(self.hidden), "out_width": self.out_width,
                "head": self.head, "groups": [list(g) for g in self.groups]}


def generator_spec(gan: GanConfig, out_width: int, groups) -> GeneratorSpec:
    return GeneratorSpec(gan.z_dim, tuple(gan.generator_hidden), out_width, gan.output_head,
                         tuple(tuple(g) for g in groups))


def _sample_local_rows(subset_size: int, batch: int, rng: torch.Generator, stacks: int | None = None) -> torch.Tensor:
    """Indices into a critic's subset: without replacement when the subset holds a batch, else with."""
    shape = (stacks,) if stacks is not None else ()
    if subset_size >= batch:
        if stacks is None and subset_size > 64 * batch:
            return torch.randint(subset_size, (batch,), generator=rng)
        keys = torch.rand(shape + (subset_size,), generator=rng)
        return keys.argsort(dim=-1)[..., :batch]
    return torch.randint(subset_size, shape + (batch,), generator=rng)


def _gradient_penalty(forward: Callable, real: torch.Tensor, fake: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """WGAN-GP penalty per network, (||grad D(x_hat)|| - 1)^2 averaged over the batch: shape [..]."""
    alpha = torch.rand(real.shape[:-1] + (1,), generator=rng).to(real.device)
    x_hat = (alpha * real + (1.0 - alpha) * fake).requires_grad_(True)
    out = forward(x_hat)
    (grad,) = torch.autograd.grad(out.sum(), x_hat, create_graph=True)
    return ((grad.norm(dim=-1) - 1.0) ** 2).mean(dim=-1)


# ---------------------------------------------------------------------------------------------------
# Algorithm 1: pretraining, all K (critic, throwaway generator) pairs at once
# ---------------------------------------------------------------------------------------------------

def pretrain_critics(data: torch.Tensor, partition: np.ndarray, gan: GanConfig, groups, seed: int,
                     device: torch.device, iterations: int | None = None,
                     progress: Callable[[int], None] | None = None) -> CriticStack:
    """Pretrain K critics, each against its own throwaway generator on its own subset (no privacy cost:
    nothing of this reaches the released generator except through the sanitised training steps)."""
    rng = torch.Generator().manual_seed(seed)
    k, subset = partition.shape
    width = data.shape[1]
    iterations = gan.pretrain_iterations if iterations is None else iterations
    critics = CriticStack(k, width, gan.critic_hidden, gan.critic_batchnorm, gan.init, rng, device)
    gens = GeneratorStack(k, gan.z_dim, tuple(gan.generator_hidden), width, gan.output_head, list(groups),
                          gan.init, rng, device)
    opt_d = StackedAdam(critics.params, gan.lr_critic, tuple(gan.betas))
    opt_g = StackedAdam(gens.params, gan.lr_generator, tuple(gan.betas))
    part = torch.as_tensor(partition, device=device)
    data = data.to(device)
    b, r = gan.batch_size, gan.critic_steps
    for p in critics.params + gens.params:
        p.requires_grad_(True)
    for it in range(iterations):
        # The generators do not change during the r critic steps: one call makes all r fake batches.
        with torch.no_grad():
            z = torch.randn(k, r * b, gan.z_dim, generator=rng).to(device)
            fakes = gens.forward(gens.params, z, chunks=r)
        for s in range(r):
            local = _sample_local_rows(subset, b, rng, stacks=k).to(device)
            real = data[torch.gather(part, 1, local)]
            fake = fakes[:, s * b:(s + 1) * b]
            forward = lambda x: critics.forward(critics.params, x)  # noqa: E731
            loss = (forward(fake).mean(1) - forward(real).mean(1)
                    + gan.gp_lambda * _gradient_penalty(forward, real, fake, rng)).sum()
            grads = torch.autograd.grad(loss, critics.params)
            opt_d.step_all(critics.params, list(grads))
        z = torch.randn(k, b, gan.z_dim, generator=rng).to(device)
        g_loss = -critics.forward(critics.params, gens.forward(gens.params, z)).mean(1).sum()
        grads = torch.autograd.grad(g_loss, gens.params)
        opt_g.step_all(gens.params, list(grads))
        if progress is not None:
            progress(it + 1)
    for p in critics.params:
        p.requires_grad_(False)
    return critics


# ---------------------------------------------------------------------------------------------------
# Algorithm 2: private generator training
# ---------------------------------------------------------------------------------------------------

@dataclass
class TrainingResult:
    checkpoints: list[dict]
    stopped_by_budget: bool
    seconds: float
    metrics: list[dict] = field(default_factory=list)


def planned_iterations(gan: GanConfig, privacy: PrivacyConfig, setting: Setting, n_rows: int) -> tuple[int, list[float]]:
    """Last iteration to train and the epsilon at each checkpoint up to it.

    With a budget, training stops at the last checkpoint whose epsilon is within it, never past it.
    """
    steps = list(range(0, gan.iterations + 1, gan.checkpoint_every))
    if not setting.private:
        return gan.iterations, [math.inf] * len(steps)
    eps = epsilons_at(setting.discriminators, steps, gan.batch_size, privacy.noise_multiplier, privacy.delta)
    if privacy.epsilon_budget is None:
        return gan.iterations, eps
    allowed = [t for t, e in zip(steps, eps) if e <= privacy.epsilon_budget]
    if len(allowed) <= 1:
        raise BudgetExceededError(
            f"Setting {setting.name!r}: even the first checkpoint (iteration {gan.checkpoint_every}) costs "
            f"epsilon {eps[1]:.2f}, above the budget {privacy.epsilon_budget}. Raise the budget, or use more "
            "discriminators, fewer iterations between checkpoints or a larger noise multiplier.")
    return allowed[-1], eps[: len(allowed)]


class GeneratorTrainer:
    """Algorithm 2 with checkpointing. `run()` resumes from `checkpoint_dir/training_state.pt` if present."""

    def __init__(self, data: torch.Tensor, partition: np.ndarray, critics: CriticStack, gan: GanConfig,
                 privacy: PrivacyConfig, setting: Setting, groups, seed: int, checkpoint_dir: Path,
                 device: torch.device, level_share_fn: Callable[[np.ndarray], dict] | None = None):
        self.gan, self.privacy, self.setting = gan, privacy, setting
        self.device = device
        self.data = data.to(device)
        self.partition = torch.as_tensor(partition, device=device)
        self.critics = critics
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = torch.Generator().manual_seed(seed)
        self.spec = generator_spec(gan, data.shape[1], groups)
        self.generator = self.spec.build()
        init_generator_(self.generator, gan.init, self.rng)
        self.generator.to(device)
        self.ema = None
        if gan.generator_ema is not None:
            self.ema = self.spec.build().to(device)
            self.ema.load_state_dict(self.generator.state_dict())
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=gan.lr_generator, betas=tuple(gan.betas))
        # A fresh Adam per critic for the training phase, as in the official GS-WGAN code.
        self.opt_d = StackedAdam(critics.params, gan.lr_critic, tuple(gan.betas))
        self.accountant = GSWGANAccountant(setting.discriminators, gan.batch_size, privacy.noise_multiplier)
        self.iteration = 0
        self.ledger: list[dict] = []
        self.metrics: list[dict] = []
        self.level_share_fn = level_share_fn

    # -- one iteration ---------------------------------------------------------------------------
    def _critic_steps(self, k: int) -> float:
        gan = self.gan
        subset = self.partition.shape[1]
        params = [p[k].clone().requires_grad_(True) for p in self.critics.params]
        exp_avg = [m[k].clone() for m in self.opt_d.exp_avg]
        exp_avg_sq = [v[k].clone() for v in self.opt_d.exp_avg_sq]
        forward = lambda x: self.critics.forward(params, x)  # noqa: E731
        wasserstein = 0.0
        for _ in range(gan.critic_steps):
            local = _sample_local_rows(subset, gan.batch_size, self.rng).to(self.device)
            real = self.data[self.partition[k, local]]
            with torch.no_grad():
                z = torch.randn(gan.batch_size, gan.z_dim, generator=self.rng).to(self.device)
                fake = self.generator(z)
            d_real, d_fake = forward(real).mean(), forward(fake).mean()
            loss = d_fake - d_real + gan.gp_lambda * _gradient_penalty(forward, real, fake, self.rng)
            grads = torch.autograd.grad(loss, params)
            self.opt_d.step_one(k, params, list(grads), exp_avg, exp_avg_sq)
            wasserstein = float(d_real - d_fake)
        with torch.no_grad():
            for stack, value in zip((self.critics.params, self.opt_d.exp_avg, self.opt_d.exp_avg_sq),
                                    (params, exp_avg, exp_avg_sq)):
                for p, v in zip(stack, value):
                    p[k] = v.detach()
        return wasserstein

    def generator_step(self, k: int) -> torch.Tensor:
        """One generator step against frozen critic k; returns the (sanitised) upstream gradient."""
        gan = self.gan
        params = [p[k] for p in self.critics.params]  # plain tensors: the critic is frozen here
        z = torch.randn(gan.batch_size, gan.z_dim, generator=self.rng).to(self.device)
        fake = self.generator(z)
        # Cut the graph at the generated rows: the critic reaches G only through this tensor.
        rows = fake.detach().requires_grad_(True)
        g_loss = -self.critics.forward(params, rows).sum()
        (upstream,) = torch.autograd.grad(g_loss, rows)
        if self.setting.private:
            upstream = sanitize_rows(upstream, self.privacy.clip, self.privacy.noise_multiplier, self.rng)
        self.opt_g.zero_grad(set_to_none=True)
        fake.backward(upstream / gan.batch_size)
        self.opt_g.step()
        if self.ema is not None:
            with torch.no_grad():
                decay = self.gan.generator_ema
                for pe, p in zip(self.ema.parameters(), self.generator.parameters()):
                    pe.lerp_(p, 1.0 - decay)
                for be, b in zip(self.ema.buffers(), self.generator.buffers()):
                    be.copy_(b)
        return upstream

    def step(self) -> float:
        k = int(torch.randint(self.partition.shape[0], (1,), generator=self.rng))
        wasserstein = self._critic_steps(k)
        self.generator_step(k)
        if self.setting.private:
            self.accountant.step()
        self.iteration += 1
        return wasserstein

    # -- checkpoints ------------------------------------------------------------------------------
    def released_generator(self) -> Generator:
        return self.ema if self.ema is not None else self.generator

    def _epsilon(self) -> float:
        if not self.setting.private:
            return math.inf
        return self.accountant.get_epsilon(self.privacy.delta)

    def _save_checkpoint(self) -> None:
        it = self.iteration
        gen_file = self.dir / f"generator_{it:06d}.pt"
        epsilon = self._epsilon()
        _atomic_save({"spec": self.spec.to_dict(), "state_dict": self.released_generator().state_dict(),
                      "iteration": it, "epsilon": epsilon, "delta": self.privacy.delta}, gen_file)
        entry = {"iteration": it, "epsilon": epsilon, "generator": gen_file.name}
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
            "ledger": self.ledger,
            "metrics": self.metrics,
        }
        _atomic_save(state, self.dir / STATE_FILE)
        _atomic_write_text(json.dumps({"mechanism": MECHANISM if self.setting.private else None,
                                       "checkpoints": self.ledger}, indent=1), self.dir / LEDGER_FILE)

    def _load_state(self) -> bool:
        path = self.dir / STATE_FILE
        if not path.exists():
            return False
        state = torch.load(path, map_location=self.device, weights_only=False)
        self.iteration = state["iteration"]
        self.generator.load_state_dict(state["generator"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        self.opt_g.load_state_dict(state["opt_g"])
        self.critics.load_state_dict(state["critics"])
        self.opt_d.load_state_dict(state["opt_d"], self.device)
        self.accountant.load_state_dict(state["accountant"])
        self.rng.set_state(state["rng"])
        self.ledger = state["ledger"]
        self.metrics = state["metrics"]
        return True

    def run(self, last_iteration: int, stop_after: int | None = None,
            progress: Callable[[int, float], None] | None = None) -> TrainingResult:
        """Train to `last_iteration`, checkpointing every `checkpoint_every`. `stop_after` ends the call
        early after that many iterations (used to simulate an interruption)."""
        start = time.perf_counter()
        if not self._load_state():
            self._save_checkpoint()  # iteration 0: the untrained generator costs no privacy
        done = 0
        self.generator.train()
        while self.iteration < last_iteration:
            if stop_after is not None and done >= stop_after:
                break
            wasserstein = self.step()
            done += 1
            if self.iteration % self.gan.checkpoint_every == 0:
                # Internal only: derived from real rows through the critic.
                self.metrics.append({"iteration": self.iteration, "critic_wasserstein": wasserstein})
                self._save_checkpoint()
                if progress is not None:
                    progress(self.iteration, self._epsilon())
        return TrainingResult(list(self.ledger), last_iteration < self.gan.iterations,
                              time.perf_counter() - start, list(self.metrics))


# ---------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------

def load_generator(path: str | Path, device: str | torch.device = "cpu") -> tuple[Generator, dict]:
    blob = torch.load(path, map_location=device, weights_only=False)
    gen = GeneratorSpec.from_dict(blob["spec"]).build()
    gen.load_state_dict(blob["state_dict"])
    gen.eval()
    return gen, blob


def sample_encoded(gen: Generator, n_rows: int, seed: int, batch: int = 8192) -> np.ndarray:
    """n rows of generator output (encoded width), from z ~ N(0, I) fixed by the seed."""
    rng = torch.Generator().manual_seed(seed)
    was_training = gen.training
    gen.eval()
    device = next(gen.parameters()).device
    parts = []
    with torch.no_grad():
        for start in range(0, n_rows, batch):
            z = torch.randn(min(batch, n_rows - start), gen.z_dim, generator=rng).to(device)
            parts.append(gen(z).cpu().numpy())
    gen.train(was_training)
    if not parts:
        return np.zeros((0, gen.body[-1].out_features), dtype=np.float32)
    return np.concatenate(parts)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

