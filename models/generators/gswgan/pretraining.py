"""GS-WGAN's Algorithm 1: each of the K critics pretrained against its own throwaway generator on its own
subset of the partition (no privacy cost: nothing of it reaches the released generator except through
the sanitised training steps).

Randomness. Chunk i (a range of `chunk_size` independent critic/throwaway-generator pairs) draws every
random number from its own stream `chunk_generator(seed, i)`, so chunks can run in any order or in
parallel with the same result.

Speed (bench/pretrain.py). A cache-sized chunk of pairs trains at a time with hand-written batched
forward/backward passes (models/generators/networks.py), fused Adam, reused output buffers
(`Workspace`), and one worker thread per core, each on its own chunks with one intra-op thread; the
throwaway generators' products may run in bfloat16 and the critic updates in C (devices.py).

Elsewhere. Given a `task_map` (tasks/cluster.py: a Dask cluster's workers), each chunk is a task that
carries only its own subsets' rows, so the critics are the same bits as in this process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from dpsynth.models.generators.base import TaskMap
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.devices import intra_op_threads, pretrain_matmul_dtype
from dpsynth.models.generators.gswgan.partition import sample_local_rows, subset_sizes
from dpsynth.models.generators.networks import (
    CriticStack,
    GeneratorStack,
    HeadGroup,
    StackedAdam,
    Workspace,
    draw_latent,
    head_noise_width,
)
from dpsynth.models.native.kernels import CriticRows, critic_updates, use_native_batchnorm, use_native_critics

DEFAULT_CHUNK_CPU = 32
DEFAULT_CHUNK_CUDA = 512


class PretrainingStopped(Exception):
    """Raised inside a chunk's thread once the pretraining was interrupted elsewhere."""


def critic_chunks(discriminators: int, chunk_size: int) -> list[tuple[int, int]]:
    """The ranges [start, stop) of critics trained together, in order."""
    return [(s, min(s + chunk_size, discriminators)) for s in range(0, discriminators, chunk_size)]


def chunk_generator(seed: int, index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The random stream of pretraining chunk `index`: derived from (seed, index) only."""
    state = np.random.SeedSequence([int(seed), int(index)]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & ((1 << 63) - 1))


def default_chunk_size(device: torch.device | str) -> int:
    """Pairs trained together: a CPU chunk fits its core's cache; a GPU one fills the device."""
    return DEFAULT_CHUNK_CUDA if torch.device(device).type == "cuda" else DEFAULT_CHUNK_CPU


def pretrain_draws(
    rng: torch.Generator,
    pairs: int,
    subset_size: int | torch.Tensor,
    gan: GanConfig,
    condition: tuple[int, float] | None = None,
    out_width: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The random inputs of one pretraining iteration of a chunk of `pairs` pairs, in drawing order:
    latents [pairs, (r + 1) * B, latent width] (chunk s < r of B rows: fakes of critic step s; chunk r:
    the generator step), local row indices [pairs, r, B] and interpolation weights alpha [pairs, r, B, 1].
    `subset_size` is the pairs' subset sizes ([pairs]) or one size for all.
    `out_width` (the encoded width) sizes the head's noise where the head takes some."""
    r, b = gan.critic_steps, gan.batch_size
    z = draw_latent((pairs, (r + 1) * b), gan.z_dim, condition, rng, head_noise_width(gan.output_head, out_width))
    local = sample_local_rows(subset_size, b, rng, (pairs, r))
    alpha = torch.rand(pairs, r, b, 1, generator=rng, device=rng.device)
    return z, local, alpha


def build_pretrain_chunk(
    pairs: int,
    width: int,
    gan: GanConfig,
    groups: Sequence[HeadGroup],
    rng: torch.Generator,
    device: torch.device,
    condition: tuple[int, float] | None = None,
) -> tuple[CriticStack, GeneratorStack]:
    """A chunk's initial critics and throwaway generators, drawn from its stream (before its iterations)."""
    critics = CriticStack(pairs, width, gan.critic_hidden, gan.critic_batchnorm, gan.init, rng, device)
    matmul_dtype = pretrain_matmul_dtype(gan, device)
    gens = GeneratorStack(
        pairs,
        gan.z_dim,
        tuple(gan.generator_hidden),
        width,
        gan.output_head,
        list(groups),
        gan.init,
        rng,
        device,
        condition,
        matmul_dtype,
        native_batchnorm=use_native_batchnorm(gan.kernels, device, matmul_dtype),
    )
    return critics, gens


def _pretrain_chunk(
    data: torch.Tensor,
    part: torch.Tensor,
    gan: GanConfig,
    groups: Sequence[HeadGroup],
    rng: torch.Generator,
    device: torch.device,
    iterations: int,
    tick: Callable[[int], None],
    condition: tuple[int, float] | None,
) -> list[torch.Tensor]:
    pairs = part.shape[0]
    subset = subset_sizes(part)
    width = data.shape[1]
    critics, gens = build_pretrain_chunk(pairs, width, gan, groups, rng, device, condition)
    c_train, g_train = critics.trainable(critics.params), gens.trainable(gens.params)
    opt_d = StackedAdam(c_train, gan.lr_critic, gan.betas)
    opt_g = StackedAdam(g_train, gan.lr_generator, gan.betas)
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
            critic_updates(
                critics.params,
                opt_d.exp_avg,
                opt_d.exp_avg_sq,
                opt_d.steps,
                source,
                alpha,
                opt_d.lr,
                opt_d.betas,
                opt_d.eps,
                gan.gp_lambda,
            )
            opt_d.steps += r
        elif critics.batchnorm:
            real = data[real_rows].view(pairs, r, b, width)
            for s in range(r):
                grads, _ = critics.loss_grads(
                    critics.params, real[:, s], fakes[:, s * b : (s + 1) * b], alpha[:, s], gan.gp_lambda
                )
                opt_d.step_all(c_train, grads)
        else:
            # Rows [real; fake] of every critic step, and the same rows times their loss weights.
            real = data[real_rows].view(pairs, r, b, width)
            x_rf = torch.cat([real, fakes[:, : r * b].view(pairs, r, b, width)], 2)
            xe = critics.weighted_rows(x_rf)
            for s in range(r):
                grads, _ = critics.loss_grads_rows(
                    critics.params, x_rf[:, s], xe[:, s], alpha[:, s], gan.gp_lambda, ws=ws
                )
                opt_d.step_all(c_train, grads)
        # Generator loss -mean D(G(z)) per pair, through the updated (now fixed) critic.
        dfake = critics.input_grad(critics.params, fakes[:, r * b :], ws).mul_(-1.0 / b)
        opt_g.step_all(g_train, gens.backward(gens.params, saved, dfake, ws))
        tick(pairs)
    return critics.params


def pretrain_critics(
    data: torch.Tensor,
    partition: np.ndarray,
    gan: GanConfig,
    groups: Sequence[HeadGroup],
    seed: int,
    device: torch.device,
    iterations: int | None = None,
    progress: Callable[[int], None] | None = None,
    chunk_size: int | None = None,
    workers: int | None = None,
    condition: tuple[int, float] | None = None,
    task_map: TaskMap | None = None,
) -> CriticStack:
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
    the throwaway generators are conditional like the released one (generator_files.py `target_condition`).
    With a `task_map` each chunk runs as a task there (`pretrain_chunk_task`), to the same critics.
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
    stopped = threading.Event()

    def tick(pairs: int) -> None:
        if stopped.is_set():
            raise PretrainingStopped
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

    if task_map is not None:
        args = (data, part, chunks, gan, groups, seed, device, iterations, tick, condition)
        results = _pretrain_elsewhere(task_map, *args)
    else:
        with intra_op_threads(1 if device.type == "cpu" else None):
            if workers > 1:
                pool = ThreadPoolExecutor(workers)
                try:
                    results = list(pool.map(work, range(len(chunks))))
                finally:
                    # When this thread is interrupted (SIGTERM, Ctrl-C, a failing chunk), the chunks still
                    # running stop at their next iteration and the queued ones never start; a plain
                    # `with` would wait for every chunk's whole pretraining (hours at K = 1000).
                    stopped.set()
                    pool.shutdown(wait=True, cancel_futures=True)
            else:
                results = [work(i) for i in range(len(chunks))]
    params = [torch.cat(parts) for parts in zip(*results, strict=False)]
    return CriticStack.from_params(params, gan.critic_batchnorm)


def _pretrain_elsewhere(
    task_map: TaskMap,
    data: torch.Tensor,
    part: torch.Tensor,
    chunks: list[tuple[int, int]],
    gan: GanConfig,
    groups: Sequence[HeadGroup],
    seed: int,
    device: torch.device,
    iterations: int,
    tick: Callable[[int], None],
    condition: tuple[int, float] | None,
) -> list[list[torch.Tensor]]:
    arguments = []
    for index, (start, stop) in enumerate(chunks):
        rows, local = chunk_rows(data, part[start:stop])
        arguments.append((rows, local, gan, list(groups), seed, index, str(device), iterations, condition))
    return task_map(pretrain_chunk_task, arguments, done=lambda i: tick((chunks[i][1] - chunks[i][0]) * iterations))


def chunk_rows(data: torch.Tensor, part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Only the rows a chunk's subsets hold, and its partition re-indexed into them (padding stays -1): a
    chunk reads the same values through either, so a task ships its own subsets, not the table."""
    members = part.reshape(-1)
    rows = data[members.clamp(min=0)].cpu()
    local = torch.arange(members.numel(), device=part.device).reshape(part.shape)
    return rows, torch.where(part >= 0, local, torch.full_like(local, -1)).cpu()


def pretrain_chunk_task(
    rows: torch.Tensor,
    part: torch.Tensor,
    gan: GanConfig,
    groups: Sequence[HeadGroup],
    seed: int,
    index: int,
    device: str,
    iterations: int,
    condition: tuple[int, float] | None,
) -> list[torch.Tensor]:
    """Chunk `index` of `pretrain_critics`, on a worker: its own stream, one intra-op thread (as the local
    path: the result must not depend on the worker's thread count). The thread count is left at one,
    not restored: tasks run side by side in a worker's threads, and a restore by one would raise the count
    under another."""
    target = torch.device(device)
    if target.type == "cpu" and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    rng = chunk_generator(seed, index, target if target.type == "cuda" else "cpu")
    params = _pretrain_chunk(
        rows.to(target), part.to(target), gan, groups, rng, target, iterations, lambda _: None, condition
    )
    return [p.cpu() for p in params]
