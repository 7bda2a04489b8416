"""Benchmark of GS-WGAN critic pretraining (Algorithm 1): naive per-critic loop vs the batched ensemble.

What is measured, on the same data (56,000 rows of width 16, like Cardio's encoded training split) and
the thesis networks (generator 32 -> 128 -> 256 -> 16 with BatchNorm, critic 16 -> 128 -> 1, B = 32,
r = 5 critic steps per generator step):

* fast: `dpsynth.models.generators.gswgan.pretraining.pretrain_critics` for all K critics (default 1,500),
`--iterations` iterations
  (default 8), wall clock of the whole call (chunk set-up included). A second call with 2 iterations
  separates the one-off set-up from the cost per iteration for the projection.
* naive: what the official GS-WGAN pretrain.py does, one critic at a time: an `nn.Module` critic and
  its own throwaway `nn.Module` generator, `torch.optim.Adam` each, autograd for the gradient penalty,
  a Python loop over iterations, one intra-op thread (fastest for its small operations). Timed on a
  sample of critics (`--naive-critics`, default 20) for `--naive-iterations` (default 10) and scaled
  per critic-iteration to the fast run's K x iterations.

Printed: {"naive_s", "fast_s", "ratio", "projected_full_min", ...}: naive_s and fast_s are seconds for
the same K x iterations; projected_full_min projects the fast path to K x 2,000 iterations (thesis):
set-up + 2,000 x the measured cost of one more iteration.
The last line of standard output is the JSON object.

Usage: ``python -m bench.pretrain [--json] [--device auto|cpu|cuda] [-k 1500] [--iterations 6]``
"""

from __future__ import annotations

import numpy as np
import torch

from bench._common import (
    Timer,
    add_width_argument,
    bench_condition,
    bench_gan,
    bench_groups,
    bench_secret,
    device_of,
    emit_widths,
    make_data,
    naive_critic,
    naive_critic_step,
    naive_generator,
    parser,
)
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.devices import kernels_in_use
from dpsynth.models.generators.gswgan.partition import make_partition
from dpsynth.models.generators.gswgan.pretraining import pretrain_critics

FULL_ITERATIONS = 2000
SHORT_ITERATIONS = 2


def naive_pretrain(
    data: torch.Tensor,
    partition: np.ndarray,
    gan: GanConfig,
    critics: int,
    iterations: int,
    device: torch.device,
    seed: int,
    groups: list,
) -> None:
    """One (critic, throwaway generator) pair after the other, plain PyTorch."""
    torch.manual_seed(seed)
    width = data.shape[1]
    b, r = gan.batch_size, gan.critic_steps
    for j in range(critics):
        subset = data[torch.as_tensor(partition[j][partition[j] >= 0])].to(device)
        critic = naive_critic(gan, width).to(device)
        gen = naive_generator(gan, groups).to(device)
        opt_d = torch.optim.Adam(critic.parameters(), lr=gan.lr_critic, betas=tuple(gan.betas))
        opt_g = torch.optim.Adam(gen.parameters(), lr=gan.lr_generator, betas=tuple(gan.betas))
        for _ in range(iterations):
            for p in critic.parameters():
                p.requires_grad_(True)
            for _ in range(r):
                real = subset[torch.randperm(subset.shape[0], device=device)[:b]]
                with torch.no_grad():
                    fake = gen(gen.latent(b, torch.default_generator).to(device))
                naive_critic_step(critic, opt_d, real, fake, gan.gp_lambda)
            for p in critic.parameters():
                p.requires_grad_(False)
            opt_g.zero_grad(set_to_none=True)
            loss = -critic(gen(gen.latent(b, torch.default_generator).to(device))).mean()
            loss.backward()
            opt_g.step()


def main(argv=None) -> dict:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=8, help="iterations of the (longer) fast run")
    ap.add_argument("--naive-critics", type=int, default=20)
    ap.add_argument("--naive-iterations", type=int, default=10)
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--workers", type=int, default=None)
    add_width_argument(ap)
    args = ap.parse_args(argv)
    summaries = [measure(args, width) for width in (args.width or [None])]
    return emit_widths(summaries, args.json)


def measure(args, width: int | None) -> dict:
    """Time the fast and the naive code on the table of this width (None: the default table)."""
    device = device_of(args.device)
    gan = bench_gan(args.profile)
    condition = bench_condition(gan)
    groups = bench_groups(width)
    data = make_data(args.seed, width=groups[-1][1])
    k = args.discriminators
    partition = make_partition(data.shape[0], k, bench_secret(args.seed))

    # Warm-up outside the timed regions (libraries, thread pools, allocator).
    pretrain_critics(
        data, partition[:8], gan, groups, args.seed, device, iterations=2, chunk_size=4, condition=condition
    )
    naive_pretrain(data, partition, gan, 1, 2, device, args.seed, groups)

    def fast_run(iterations: int) -> float:
        with Timer(device) as timer:
            pretrain_critics(
                data,
                partition,
                gan,
                groups,
                args.seed,
                device,
                iterations=iterations,
                chunk_size=args.chunk_size,
                workers=args.workers,
                condition=condition,
            )
        return timer.seconds

    # Two runs: their difference is the cost of the extra iterations without the one-off set-up
    # (initialisation, buffers), which the projection to 2,000 iterations adds once.
    short_s = fast_run(SHORT_ITERATIONS)
    fast_s = fast_run(args.iterations)
    per_iteration = max(fast_s - short_s, 1e-9) / (args.iterations - SHORT_ITERATIONS)
    setup_s = max(short_s - SHORT_ITERATIONS * per_iteration, 0.0)
    fast_per = per_iteration / k

    sample = min(args.naive_critics, k)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # its operations on 32-row batches run fastest on one thread
    try:
        with Timer(device) as naive:
            naive_pretrain(data, partition, gan, sample, args.naive_iterations, device, args.seed, groups)
    finally:
        torch.set_num_threads(before)
    naive_per = naive.seconds / (sample * args.naive_iterations)

    naive_s = naive_per * k * args.iterations
    summary = {
        "naive_s": round(naive_s, 2),
        "fast_s": round(fast_s, 2),
        "ratio": round(naive_s / fast_s, 1),
        "projected_full_min": round((setup_s + per_iteration * FULL_ITERATIONS) / 60.0, 1),
        "naive_ms_per_critic_iteration": round(naive_per * 1e3, 3),
        "fast_ms_per_critic_iteration": round(fast_per * 1e3, 4),
        "fast_setup_s": round(setup_s, 2),
        "width": data.shape[1],
        "columns": "census-like mix" if width is not None else "all continuous",
        "discriminators": k,
        "iterations": args.iterations,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "profile": args.profile or "plain thesis hyperparameters",
        "kernels": kernels_in_use(gan, device),
    }
    return summary


if __name__ == "__main__":
    main()
