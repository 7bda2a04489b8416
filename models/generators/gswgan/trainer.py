"""GS-WGAN for tables: partition, batched critic pretraining (Algorithm 1) and private generator
training (Algorithm 2) with checkpoints that resume exactly.

Randomness. The partition of the training rows (`make_partition`) comes from the run's privacy secret
(models/privacy/secret.py). Pretraining chunk i (a range of `chunk_size` independent critic/throwaway-generator
pairs) draws everything else from its own stream `chunk_generator(seed, i)`, so chunks can run in any
order or in parallel with the same result. Training draws the critics each sanitised row queries and the
sanitiser's noise from the secret's "training" stream, and everything else (batches, latents: z, labels
and head noise; gradient penalty weights) from one seeded CPU `torch.Generator`; both states are
checkpointed, so a resumed run ends exactly as an uninterrupted one.

Speed (bench/pretrain.py, bench/train.py). Pretraining trains a cache-sized chunk of pairs at a time
with hand-written batched forward/backward passes (models/generators/networks.py), fused Adam, reused output
buffers (`Workspace`), and one worker thread per core, each on its own chunks with one intra-op thread.
On a CPU with native bfloat16 the throwaway generators' products run in bfloat16 with float32
accumulation (`pretrain_matmul_dtype`), about twice as fast as float32 ones.
Training refreshes the step's refresh slots' critics in place in the stack, all against the same r fake
batches made in one pass, queries each generated row through its own critic (gathered parameters, one
batched product), and steps G's fused Adam directly; it uses one intra-op thread (`threads`), and the
C refresh splits a step's refreshed critics over `refresh_workers` threads (each core it may use). Where
they build, C kernels (models/native/kernels.py, `gan.kernels`) run all updates of a step's drawn
critics, or of a pretraining chunk, in one call, and pretraining's bfloat16 BatchNorm in one pass.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dpsynth.models.checkpoint_files import (
    load_verified,
    resume_state,
    save_training_state,
    save_verified,
    write_text_atomic,
)
from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.sanitizer import sanitize_rows
from dpsynth.models.generators.networks import (
    CriticStack,
    Generator,
    GeneratorStack,
    StackedAdam,
    Workspace,
    draw_latent,
    head_noise_width,
    init_generator_,
)
from dpsynth.models.native.kernels import (
    CriticRows,
    critic_input_grads,
    critic_updates,
    use_native_batchnorm,
    use_native_critics,
)
from dpsynth.models.privacy.accountant import GSWGANAccountant, epsilons_at
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def make_partition(n_rows: int, discriminators: int, secret: PrivacySecret) -> np.ndarray:
    """K disjoint subsets covering all n training rows: row j goes to subset (position of j in a
    permutation drawn from the secret's "partition" stream) mod K. Which subset a row joins depends on
    its position and the secret only, never on any row's values, so changing one row moves no other;
    sizes are floor(n/K) or one more (no row is dropped).

    Returns [K, ceil(n/K)] row positions, padded with -1 where a subset holds floor(n/K) rows (see
    `subset_sizes`). The accountant's 1/K does not depend on the sizes: every query draws its critic
    uniformly among the K."""
    if n_rows < discriminators:
        raise ConfigError(f"{n_rows} training rows cannot be split among {discriminators} discriminators.")
    order = secret.numpy("partition").permutation(n_rows)
    width = -(-n_rows // discriminators)
    padded = np.full(width * discriminators, -1, dtype=np.int64)
    padded[:n_rows] = order
    # Position p of the permutation goes to subset p mod K: column-major fill of [width, K].
    return padded.reshape(width, discriminators).T.copy()


def subset_sizes(partition) -> np.ndarray | torch.Tensor:
    """Rows in each subset of a (padded) partition."""
    return (partition >= 0).sum(1)


@dataclass(frozen=True)
class GeneratorSpec:
    """Everything needed to rebuild a generator for sampling, stored beside its weights."""

    z_dim: int
    hidden: tuple[int, ...]
    out_width: int
    head: str
    groups: tuple[tuple[int, int], ...]
    # (target column, probability of its second level) for a generator conditioned on the target.
    condition: tuple[int, float] | None = None

    def build(self) -> Generator:
        return Generator(self.z_dim, self.hidden, self.out_width, self.head, [tuple(g) for g in self.groups],
                         self.condition)

    @classmethod
    def from_dict(cls, d: dict) -> GeneratorSpec:
        condition = d.get("condition")
        return cls(d["z_dim"], tuple(d["hidden"]), d["out_width"], d["head"], tuple(tuple(g) for g in d["groups"]),
                   (int(condition[0]), float(condition[1])) if condition is not None else None)

    def to_dict(self) -> dict:
        return {"z_dim": self.z_dim, "hidden": list(self.hidden), "out_width": self.out_width,
                "head": self.head, "groups": [list(g) for g in self.groups],
                "condition": list(self.condition) if self.condition is not None else None}


def generator_spec(gan: GanConfig, out_width: int, groups,
                   condition: tuple[int, float] | None = None) -> GeneratorSpec:
    return GeneratorSpec(gan.z_dim, tuple(gan.generator_hidden), out_width, gan.output_head,
                         tuple(tuple(g) for g in groups), condition)


def target_condition(gan: GanConfig, target_index: int, target_kind: str) -> tuple[int, float] | None:
    """The generator's condition for `gan.condition_on_target`: the target's encoded column and the
    public share of its second level (`gan.target_prior`). Only a binary target (one encoded column)
    can be a condition."""
    if not gan.condition_on_target:
        return None
    if target_kind != "binary":
        raise ConfigError(f"gan.condition_on_target needs a binary target column, not a {target_kind} one.")
    return (int(target_index), float(gan.target_prior))


def _sample_local_rows(sizes, batch: int, rng: torch.Generator, shape: tuple[int, ...] = (),
                       bounds: tuple[int, int] | None = None) -> torch.Tensor:
    """Indices into critics' subsets, shape `shape + (batch,)`; `sizes` is one subset size, or the sizes
    [shape[0]] of the subsets along the first dimension. Without replacement when every subset holds a
    batch; with replacement when one does not, or when one holds more than 64 batches (then a repeat
    within a batch is rare and drawing keys for every row of the subset would cost more than the step).

    `bounds` (smallest, largest) over ALL subsets makes the choice between those ways, and how many
    numbers are drawn from `rng`, independent of which subsets `sizes` names: training passes it, so
    the seeded stream's later draws (the latents the released generator sees) never depend on which
    critics the secret picked."""
    shape = tuple(shape)
    sizes = torch.as_tensor(sizes, device=rng.device).reshape(-1)
    smallest, largest = (int(sizes.min()), int(sizes.max())) if bounds is None else bounds
    if smallest == largest and (smallest < batch or smallest > 64 * batch):
        return torch.randint(smallest, shape + (batch,), generator=rng, device=rng.device)
    # Each subset's size, broadcastable against the trailing dimensions (..., batch) or (..., size).
    if sizes.numel() > 1:
        size = sizes.reshape((-1,) + (1,) * (len(shape) - 1)).unsqueeze(-1)
    else:
        size = sizes.reshape(())
    if smallest < batch or largest > 64 * batch:
        u = torch.rand(shape + (batch,), generator=rng, device=rng.device)
        return torch.minimum((u * size).long(), size - 1)
    keys = torch.rand(shape + (largest,), generator=rng, device=rng.device)
    if smallest != largest:
        # Positions past a subset's end sort last, so the first `batch` keys fall inside it.
        keys.masked_fill_(torch.arange(largest, device=rng.device) >= size, 2.0)
    if keys.device.type == "cpu":
        # numpy's introsort on these short rows takes a sixth of torch's argsort (a training step at 128
        # columns spent 0.3 ms here); ties between the uniform keys are as rare either way.
        return torch.from_numpy(np.argsort(keys.numpy(), axis=-1)[..., :batch])
    return keys.argsort(dim=-1)[..., :batch]


# ---------------------------------------------------------------------------------------------------
# Algorithm 1: pretraining, the K (critic, throwaway generator) pairs in independent chunks
# ---------------------------------------------------------------------------------------------------

DEFAULT_CHUNK_CPU = 32
DEFAULT_CHUNK_CUDA = 512


def critic_chunks(discriminators: int, chunk_size: int) -> list[tuple[int, int]]:
    """The ranges [start, stop) of critics trained together, in order."""
    return [(s, min(s + chunk_size, discriminators)) for s in range(0, discriminators, chunk_size)]


def chunk_generator(seed: int, index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The random stream of pretraining chunk `index`: derived from (seed, index) only."""
    state = np.random.SeedSequence([int(seed), int(index)]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & ((1 << 63) - 1))


def default_chunk_size(device: torch.device) -> int:
    return DEFAULT_CHUNK_CUDA if torch.device(device).type == "cuda" else DEFAULT_CHUNK_CPU


def pretrain_draws(rng: torch.Generator, pairs: int, subset_size, gan: GanConfig,
                   condition: tuple[int, float] | None = None, out_width: int = 0):
    """The random inputs of one pretraining iteration of a chunk of `pairs` pairs, in drawing order:
    latents [pairs, (r + 1) * B, latent width] (chunk s < r of B rows: fakes of critic step s; chunk r:
    the generator step), local row indices [pairs, r, B] and interpolation weights alpha [pairs, r, B, 1].
    `subset_size` is the pairs' subset sizes ([pairs]) or one size for all.
    `out_width` (the encoded width) sizes the head's noise where the head takes some."""
    r, b = gan.critic_steps, gan.batch_size
    z = draw_latent((pairs, (r + 1) * b), gan.z_dim, condition, rng, head_noise_width(gan.output_head, out_width))
    local = _sample_local_rows(subset_size, b, rng, (pairs, r))
    alpha = torch.rand(pairs, r, b, 1, generator=rng, device=rng.device)
    return z, local, alpha


def pretrain_matmul_dtype(gan: GanConfig, device: torch.device | str) -> torch.dtype | None:
    """The throwaway generators' product dtype (None: float32) for `gan.pretrain_matmul`. "auto" takes
    bfloat16 only on a CPU with native bfloat16 arithmetic, where it makes the largest products of
    pretraining about twice as fast; elsewhere bfloat16 is emulated and slower."""
    choice = gan.pretrain_matmul
    if choice == "auto":
        choice = "bfloat16" if torch.device(device).type == "cpu" and _cpu_has_native_bfloat16() else "float32"
    return torch.bfloat16 if choice == "bfloat16" else None


def _cpu_has_native_bfloat16() -> bool:
    try:   # oneDNN's own check (AVX512-BF16, AMX); a build without it has no native bfloat16 path
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def kernels_in_use(gan: GanConfig, device: torch.device | str) -> dict[str, str]:
    """What `gan.kernels` resolves to here, per inner loop ("native": the C kernels; "torch": tensor code)."""
    critics = use_native_critics(gan.kernels, gan.critic_hidden, gan.critic_batchnorm, device)
    batchnorm = use_native_batchnorm(gan.kernels, device, pretrain_matmul_dtype(gan, device))
    return {"critic_updates": "native" if critics else "torch",
            "pretrain_batchnorm": "native" if batchnorm else "torch"}


def build_pretrain_chunk(pairs: int, width: int, gan: GanConfig, groups, rng: torch.Generator,
                         device: torch.device, condition: tuple[int, float] | None = None,
                         ) -> tuple[CriticStack, GeneratorStack]:
    """A chunk's initial critics and throwaway generators, drawn from its stream (before its iterations)."""
    critics = CriticStack(pairs, width, gan.critic_hidden, gan.critic_batchnorm, gan.init, rng, device)
    matmul_dtype = pretrain_matmul_dtype(gan, device)
    gens = GeneratorStack(pairs, gan.z_dim, tuple(gan.generator_hidden), width, gan.output_head, list(groups),
                          gan.init, rng, device, condition, matmul_dtype,
                          native_batchnorm=use_native_batchnorm(gan.kernels, device, matmul_dtype))
    return critics, gens


def _pretrain_chunk(data: torch.Tensor, part: torch.Tensor, gan: GanConfig, groups, rng: torch.Generator,
                    device: torch.device, iterations: int, tick: Callable[[int], None],
                    condition: tuple[int, float] | None) -> list[torch.Tensor]:
    pairs = part.shape[0]
    subset = subset_sizes(part)
    width = data.shape[1]
    critics, gens = build_pretrain_chunk(pairs, width, gan, groups, rng, device, condition)
    c_train, g_train = critics.trainable(critics.params), gens.trainable(gens.params)
    opt_d = StackedAdam(c_train, gan.lr_critic, tuple(gan.betas))
    opt_g = StackedAdam(g_train, gan.lr_generator, tuple(gan.betas))
    r, b = gan.critic_steps, gan.batch_size
    ws = Workspace()
    native = use_native_critics(gan.kernels, gan.critic_hidden, critics.batchnorm, device)
    for _ in range(iterations):
        z, local, alpha = (t.to(device) for t in pretrain_draws(rng, pairs, subset, gan, condition, width))
        # The generators do not change during the r critic steps: one pass makes all r fake batches
        # and the generator step's batch (BatchNorm statistics per batch of B rows).
        fakes, saved = gens.forward_train(gens.params, z, r + 1, ws)
        real_rows = torch.gather(part, 1, local.reshape(pairs, r * b))
        if native:
            # All r updates of every critic of the chunk in one C call (models/native/kernels.py), reading
            # the real rows by index and each pair's fake rows where they lie.
            source = CriticRows(data, real_rows.view(pairs, r, b), fakes, shared=False)
            critic_updates(critics.params, opt_d.exp_avg, opt_d.exp_avg_sq, opt_d.steps, source, alpha,
                           opt_d.lr, opt_d.betas, opt_d.eps, gan.gp_lambda)
            opt_d.steps += r
        elif critics.batchnorm:
            real = data[real_rows].view(pairs, r, b, width)
            for s in range(r):
                grads, _ = critics.loss_grads(critics.params, real[:, s], fakes[:, s * b:(s + 1) * b], alpha[:, s],
                                              gan.gp_lambda)
                opt_d.step_all(c_train, grads)
        else:
            # Rows [real; fake] of every critic step, and the same rows times their loss weights.
            real = data[real_rows].view(pairs, r, b, width)
            x_rf = torch.cat([real, fakes[:, :r * b].view(pairs, r, b, width)], 2)
            xe = critics.weighted_rows(x_rf)
            for s in range(r):
                grads, _ = critics.loss_grads_rows(critics.params, x_rf[:, s], xe[:, s], alpha[:, s], gan.gp_lambda,
                                                   ws=ws)
                opt_d.step_all(c_train, grads)
        # Generator loss -mean D(G(z)) per pair, through the updated (now fixed) critic.
        dfake = critics.input_grad(critics.params, fakes[:, r * b:], ws).mul_(-1.0 / b)
        opt_g.step_all(g_train, gens.backward(gens.params, saved, dfake, ws))
        tick(pairs)
    return critics.params


def pretrain_critics(data: torch.Tensor, partition: np.ndarray, gan: GanConfig, groups, seed: int,
                     device: torch.device, iterations: int | None = None,
                     progress: Callable[[int], None] | None = None, chunk_size: int | None = None,
                     workers: int | None = None, condition: tuple[int, float] | None = None) -> CriticStack:
    """Pretrain K critics, each against its own throwaway generator on its own subset (official GS-WGAN;
    no privacy cost: nothing of this reaches the released generator except through the sanitised
    training steps).

    The K pairs are independent, so they train in chunks of `chunk_size` pairs (sized for the CPU cache;
    default 32 on CPU, 512 on CUDA), all iterations of one chunk before the next. Chunk i draws every
    random number (initialisation included) from its own stream `chunk_generator(seed, i)`, so the result
    depends on the seed and the chunk size only, not on the order in which chunks run. On CPU, `workers`
    threads (default: torch's intra-op thread count, i.e. one per core) train different chunks at once,
    each with one intra-op thread (also with one worker, so the result is the same for any `workers`).
    `progress(i)` is called as the work of i iterations of all K pairs completes. With a `condition`
    the throwaway generators are conditional like the released one (see `target_condition`).
    """
    device = torch.device(device)
    k = partition.shape[0]
    iterations = gan.pretrain_iterations if iterations is None else iterations
    chunk_size = chunk_size or default_chunk_size(device)
    chunks = critic_chunks(k, chunk_size)
    if device.type == "cuda":
        workers = 1
    elif workers is None:
        workers = torch.get_num_threads()
    workers = max(1, min(workers, len(chunks)))
    part = torch.as_tensor(partition, device=device)
    data = data.to(device)
    rng_device = device if device.type == "cuda" else "cpu"

    lock = threading.Lock()
    done = [0, 0]  # critic-iterations, iterations reported

    def tick(pairs: int) -> None:
        if progress is None:
            return
        with lock:
            done[0] += pairs
            whole = done[0] // k
            if whole > done[1]:
                done[1] = whole
                progress(whole)

    def work(index: int) -> list[torch.Tensor]:
        start, stop = chunks[index]
        rng = chunk_generator(seed, index, rng_device)
        return _pretrain_chunk(data, part[start:stop], gan, groups, rng, device, iterations, tick, condition)

    with _intra_op_threads(1 if device.type == "cpu" else None):
        if workers > 1:
            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(work, range(len(chunks))))
        else:
            results = [work(i) for i in range(len(chunks))]
    params = [torch.cat(parts) for parts in zip(*results)]
    return CriticStack.from_params(params, gan.critic_batchnorm)


@contextmanager
def _intra_op_threads(n: int | None):
    """torch's intra-op thread count set to n for the block (None: unchanged). Process-wide."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------
# Algorithm 2: private generator training
# ---------------------------------------------------------------------------------------------------

@dataclass
class TrainingResult:
    checkpoints: list[dict]
    stopped_by_budget: bool
    seconds: float
    metrics: list[dict] = field(default_factory=list)


def checkpoint_epsilons(gan: GanConfig, privacy: PrivacyConfig, setting: Setting,
                        extra_rho: float = 0.0) -> tuple[list[int], list[float]]:
    """Every checkpoint of the section and training's epsilon at each, with `extra_rho` (replace-one zCDP of
    the measured marginals, read from the same rows) composed into every checkpoint's; no budget applied
    (models/privacy/budget.py cuts the schedule). A non-private setting costs infinity throughout."""
    steps = list(range(0, gan.iterations + 1, gan.checkpoint_every))
    if not setting.private:
        return steps, [math.inf] * len(steps)
    return steps, epsilons_at(setting.discriminators, steps, gan.batch_size, privacy.noise_multiplier,
                              privacy.delta, gan.critic_draw, extra_rho)


def _first_slots(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct critics in `slots` (sorted) and, for each, the first slot that names it."""
    drawn, inverse = torch.unique(slots, return_inverse=True)
    positions = torch.arange(slots.numel(), dtype=torch.int64)
    first = torch.full((drawn.numel(),), slots.numel(), dtype=torch.int64).scatter_reduce_(
        0, inverse, positions, reduce="amin")
    return drawn, first


# Split a step's critic refresh over threads only from this critic size (input width x hidden units) on:
# measured per step with K = 1000, B = 32, r = 5, hidden 128: 16 columns 5.6 -> 6.0 ms (the handoff costs
# more than it saves), 40 columns 9.3 -> 8.4, 64 columns 12.8 -> 10.3, 128 columns 29 -> 20.
SPLIT_REFRESH_MIN = 32 * 128


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

    def __init__(self, data: torch.Tensor, partition: np.ndarray, critics: CriticStack, gan: GanConfig,
                 privacy: PrivacyConfig, setting: Setting, groups, seed: int, checkpoint_dir: Path,
                 device: torch.device, secret: PrivacySecret,
                 level_share_fn: Callable[[np.ndarray], dict] | None = None,
                 threads: int | None = 1, condition: tuple[int, float] | None = None,
                 refresh_workers: int | None = None, marginals_rho: float = 0.0):
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
        self.spec = generator_spec(gan, data.shape[1], groups, condition)
        self.generator = self.spec.build()
        init_generator_(self.generator, gan.init, self.rng)
        self.generator.to(device)
        self.ema = None
        if gan.generator_ema is not None:
            self.ema = self.spec.build().to(device)
            self.ema.load_state_dict(self.generator.state_dict())
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=gan.lr_generator, betas=tuple(gan.betas),
                                      fused=True)
        self._gen_params = list(self.generator.parameters())
        self._gen_buffers = list(self.generator.buffers())
        self._adam_state_g()
        self._ws = Workspace()
        if self.ema is not None:
            self._ema_params = list(self.ema.parameters())
            self._ema_buffers = list(self.ema.buffers())
        # A fresh Adam per critic for the training phase, as in the official GS-WGAN code.
        self.opt_d = StackedAdam(critics.trainable(critics.params), gan.lr_critic, tuple(gan.betas))
        self.native_critics = use_native_critics(gan.kernels, critics.params[0].shape[-1], critics.batchnorm, device)
        self.accountant = GSWGANAccountant(setting.discriminators, gan.batch_size, privacy.noise_multiplier,
                                           gan.critic_draw)
        self.iteration = 0
        self.ledger: list[dict] = []
        self.resume_notes: list[str] = []
        self.metrics: list[dict] = []
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
        local = _sample_local_rows(self.sizes[slots], b, self.rng, (slots.numel(), r), self.size_bounds)
        alpha = torch.rand(slots.numel(), r, b, 1, generator=self.rng)
        drawn, first = _first_slots(slots)
        return self._update_critics(drawn, local[first], alpha[first], z, wasserstein)

    def _update_critics(self, drawn: torch.Tensor, local: torch.Tensor, alpha: torch.Tensor, z: torch.Tensor,
                        wasserstein: bool = False) -> float | None:
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
        return float(torch.stack(estimates).mean()) if wasserstein else None

    def _native_updates(self, source: CriticRows, alpha: torch.Tensor, index: np.ndarray,
                        wasserstein: bool) -> torch.Tensor | None:
        """The C updates of the critics at `index` (distinct), split over `refresh_workers` threads: each
        critic's updates are independent of the others', so the split changes no number (the C call
        releases the GIL)."""
        def updates(part: slice) -> torch.Tensor | None:
            return critic_updates(self.critics.params, self.opt_d.exp_avg, self.opt_d.exp_avg_sq,
                                  self.opt_d.steps[index[part]], source.part(part), alpha[part], self.opt_d.lr,
                                  self.opt_d.betas, self.opt_d.eps, self.gan.gp_lambda, wasserstein,
                                  index=index[part])

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
        return torch.cat(estimates) if wasserstein else None

    def _refresh_one(self, k: int, real: torch.Tensor, fakes: torch.Tensor, alpha: torch.Tensor,
                     wasserstein: bool) -> torch.Tensor | None:
        """The tensor code's updates of critic k (the reference of the C kernels): real, fakes [r, B, d]."""
        gan, r = self.gan, real.shape[0]
        critics = self.critics
        params = [p[k:k + 1] for p in critics.params]  # views: updated in place
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
                grads, w = critics.loss_grads_rows(params, rows[s], weighted[s], alphas[s], gan.gp_lambda, last,
                                                   self._ws)
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
            params = [p[int(drawn[0]):int(drawn[0]) + 1] for p in critics.params]
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
        self._adam_step_g()
        if self.ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(self._ema_params, self._gen_params, 1.0 - self.gan.generator_ema)
                torch._foreach_copy_(self._ema_buffers, self._gen_buffers)
        return upstream

    def _adam_state_g(self) -> None:
        """G's Adam state, created as `torch.optim.Adam(fused=True)` creates it on its first step, and
        lists of it for `_adam_step_g` (rebuilt after loading a checkpoint)."""
        for p in self._gen_params:
            state = self.opt_g.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        states = [self.opt_g.state[p] for p in self._gen_params]
        self._g_state = tuple([s[key] for s in states] for key in ("exp_avg", "exp_avg_sq", "step"))

    def _adam_step_g(self) -> None:
        """Exactly `self.opt_g.step()` (fused Adam), without the optimiser's per-call Python overhead."""
        group = self.opt_g.param_groups[0]
        exp_avg, exp_avg_sq, steps = self._g_state
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(self._gen_params, [p.grad for p in self._gen_params], exp_avg, exp_avg_sq, [], steps,
                           lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                           weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False, maximize=False)

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
        digest = save_verified({"spec": self.spec.to_dict(), "state_dict": self.released_generator().state_dict(),
                                "iteration": it, "epsilon": epsilon, "delta": self.privacy.delta}, gen_file)
        entry = {"iteration": it, "epsilon": epsilon, "generator": gen_file.name, "sha256": digest}
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
        write_text_atomic(json.dumps({"mechanism": self.accountant.mechanism if self.setting.private else None,
                                       "critic_draw": self.gan.critic_draw,
                                       "checkpoints": self.ledger}, indent=1), self.dir / LEDGER_FILE)

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
        self._adam_state_g()
        self.critics.load_state_dict(state["critics"])
        self.opt_d.load_state_dict(state["opt_d"], self.device)
        self.accountant.load_state_dict(state["accountant"])
        self.rng.set_state(state["rng"])
        self.privacy_rng.set_state(state["privacy_rng"])
        self.refresh_rng.set_state(state["refresh_rng"])
        self.ledger = state["ledger"]
        self.metrics = state["metrics"]
        return True

    def run(self, last_iteration: int, stop_after: int | None = None,
            progress: Callable[[int, float], None] | None = None,
            on_step: Callable[[int], None] | None = None) -> TrainingResult:
        """Train to `last_iteration`, checkpointing every `checkpoint_every`. `stop_after` ends the call
        early after that many iterations (used to simulate an interruption). `progress(iteration,
        epsilon)` is called at every checkpoint; `on_step(iteration)` once with the iteration training
        starts (or resumes) from, then after every iteration."""
        start = time.perf_counter()
        if not self._load_state():
            self._save_checkpoint()  # iteration 0: the untrained generator costs no privacy
        with _intra_op_threads(self.threads if self.device.type == "cpu" else None):
            self._train_to(last_iteration, stop_after, progress, on_step)
        return TrainingResult(list(self.ledger), last_iteration < self.gan.iterations,
                              time.perf_counter() - start, list(self.metrics))

    def _train_to(self, last_iteration: int, stop_after: int | None, progress, on_step) -> None:
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


# ---------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------

def load_generator(path: str | Path, device: str | torch.device = "cpu",
                   sha256: str | None = None) -> tuple[Generator, dict]:
    """A generator checkpoint; with `sha256` (the training ledger's), only if the file still matches it."""
    if sha256 is not None:
        blob = load_verified(path, sha256, map_location=device, weights_only=False)
    else:
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
            z = gen.latent(min(batch, n_rows - start), rng).to(device)
            parts.append(gen(z).cpu().numpy())
    gen.train(was_training)
    if not parts:
        return np.zeros((0, gen.body[-1].out_features), dtype=np.float32)
    return np.concatenate(parts)


