"""Benchmark of private generator training (GS-WGAN Algorithm 2): naive loop vs `GeneratorTrainer`.

What is measured, with K = 1,500 critics (freshly initialised: pretraining is bench/pretrain.py), the
private setting (sigma = 1.07, C = 1), the thesis networks and B = 32, r = 5, on 56,000 rows of width 16,
with the profile's critic draw (default: a critic per sanitised row; B critics, drawn apart from the
queried ones, refreshed r times before the query; `--profile` takes another profile's generator settings):

* fast: `dpsynth.models.generators.gswgan.trainer.GeneratorTrainer.run` for `--iterations` iterations (default
1,000) after the
  untimed iteration-0 checkpoint: resuming from it and writing the checkpoint at the end (generator,
  critics and their Adam state, epsilon) are included, as in a real run's every 1,000 iterations.
  `--iterations 20000 --checkpoint-every 1000` times a whole run as a release trains it instead: one
  resume, twenty checkpoints (from the fourth on, each overwrites the file of the state dropped before).
* naive: the same algorithm written plainly: one `nn.Module` per critic and a `torch.optim.Adam` per
  critic, each refreshed critic updated in turn, autograd for the gradient penalty and for each row's
  upstream gradient through its own critic, the generator's `torch.optim.Adam.step()`;
  `--naive-iterations` iterations (default 200), scaled per iteration.

Both run with one intra-op thread (the trainer's default on CPU; the naive code's tiny operations are
also fastest so). Printed: {"naive_s", "fast_s", "ratio", "projected_40k_min", ...}: naive_s and fast_s
are seconds for the fast run's iteration count; projected_40k_min projects the fast path to 40,000
iterations (thesis T). The last line of standard output is the JSON object.

Usage: ``python -m bench.train [--json] [--device auto|cpu|cuda] [-k 1500] [--iterations 500]``
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

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
    refresh_steps,
)
from dpsynth.models.config import PrivacyConfig, Setting
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.devices import kernels_in_use
from dpsynth.models.generators.gswgan.partition import make_partition
from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer
from dpsynth.models.generators.networks import CriticStack

FULL_ITERATIONS = 40_000


def naive_train(
    data: torch.Tensor,
    partition: np.ndarray,
    gan: GanConfig,
    privacy: PrivacyConfig,
    iterations: int,
    device: torch.device,
    seed: int,
    groups: list,
) -> None:
    torch.manual_seed(seed)
    k, width = partition.shape[0], data.shape[1]
    b, r = gan.batch_size, refresh_steps(gan)
    critics = [naive_critic(gan, width).to(device) for _ in range(k)]
    optimisers: dict[int, torch.optim.Optimizer] = {}
    gen = naive_generator(gan, groups).to(device)
    ema = copy.deepcopy(gen) if gan.generator_ema is not None else None
    opt_g = torch.optim.Adam(gen.parameters(), lr=gan.lr_generator, betas=tuple(gan.betas))
    data = data.to(device)
    for _ in range(iterations):
        if gan.critic_draw == "per_row":
            drawn = [int(j) for j in torch.randint(k, (b,))]
        else:
            drawn = [int(torch.randint(k, (1,)))] * b
        slots = b if gan.critic_draw == "per_row" else 1
        refreshed = drawn if gan.critic_refresh == "drawn" else [int(j) for j in torch.randint(k, (slots,))]
        for j in dict.fromkeys(refreshed):
            critic = critics[j]
            opt_d = optimisers.setdefault(
                j, torch.optim.Adam(critic.parameters(), lr=gan.lr_critic, betas=tuple(gan.betas))
            )
            rows = torch.as_tensor(partition[j][partition[j] >= 0], device=device)
            for p in critic.parameters():
                p.requires_grad_(True)
            for _ in range(r):
                real = data[rows[torch.randperm(rows.shape[0], device=device)[:b]]]
                with torch.no_grad():
                    fake = gen(gen.latent(b, torch.default_generator).to(device))
                naive_critic_step(critic, opt_d, real, fake, gan.gp_lambda)
            for p in critic.parameters():
                p.requires_grad_(False)
        fake = gen(gen.latent(b, torch.default_generator).to(device))
        rows_out = fake.detach().requires_grad_(True)
        # Each row's gradient through its own critic.
        grad = torch.cat(
            [
                torch.autograd.grad(-critics[j](rows_out[i : i + 1]).sum(), rows_out)[0][i : i + 1]
                for i, j in enumerate(drawn)
            ]
        )
        if gen.condition is not None:
            grad[:, gen.condition[0]] = 0.0
        norms = grad.norm(dim=1, keepdim=True)
        grad = grad * torch.clamp(privacy.clip / (norms + 1e-12), max=1.0)
        grad = grad + torch.randn_like(grad) * (2.0 * privacy.noise_multiplier * privacy.clip)
        opt_g.zero_grad(set_to_none=True)
        fake.backward(grad / b)
        opt_g.step()
        if ema is not None:
            with torch.no_grad():
                for e, p in zip(ema.state_dict().values(), gen.state_dict().values(), strict=False):
                    if e.is_floating_point():
                        e.lerp_(p, 1.0 - gan.generator_ema)
                    else:
                        e.copy_(p)


def main(argv=None) -> dict:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--naive-iterations", type=int, default=200)
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="iterations between checkpoints in the fast run (default: --iterations, one at the end); "
        "1000 with --iterations 20000 times a whole 20,000-iteration run as a release trains it",
    )
    ap.add_argument(
        "--refresh-steps",
        type=int,
        default=None,
        help="critic updates per drawn critic (default: the profile's critic_refresh_steps)",
    )
    add_width_argument(ap)
    args = ap.parse_args(argv)
    summaries = [measure(args, width) for width in (args.width or [None])]
    return emit_widths(summaries, args.json)


def measure(args, width: int | None) -> dict:
    """Time the fast and the naive code on the table of this width (None: the default table)."""
    device = device_of(args.device)
    groups = bench_groups(width)
    data = make_data(args.seed, width=groups[-1][1])
    k = args.discriminators
    secret = bench_secret(args.seed)
    partition = make_partition(data.shape[0], k, secret)
    gan = bench_gan(args.profile, iterations=args.iterations, checkpoint_every=args.checkpoint_every or args.iterations)
    if args.refresh_steps is not None:
        gan = gan.replace(critic_refresh_steps=args.refresh_steps)
    privacy = PrivacyConfig()
    setting = Setting(f"k{k}", k)

    def trainer(directory: Path, seed: int) -> GeneratorTrainer:
        critics = CriticStack(
            k,
            data.shape[1],
            gan.critic_hidden,
            gan.critic_batchnorm,
            gan.init,
            torch.Generator().manual_seed(seed),
            device,
        )
        return GeneratorTrainer(
            data,
            partition,
            critics,
            gan,
            privacy,
            setting,
            groups,
            seed,
            directory,
            device,
            secret,
            condition=bench_condition(gan),
        )

    before = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up outside the timed regions: libraries, the accountant's curve, allocator.
        trainer(Path(tmp) / "warm", args.seed).run(20)
        torch.set_num_threads(1)
        naive_train(data, partition, gan, privacy, 5, device, args.seed, groups)
        torch.set_num_threads(before)

        fast_trainer = trainer(Path(tmp) / "fast", args.seed)
        fast_trainer.run(0)  # the iteration-0 checkpoint
        fast_trainer = trainer(Path(tmp) / "fast", args.seed)
        with Timer(device) as fast:
            fast_trainer.run(args.iterations)
        torch.set_num_threads(1)
        try:
            with Timer(device) as naive:
                naive_train(data, partition, gan, privacy, args.naive_iterations, device, args.seed, groups)
        finally:
            torch.set_num_threads(before)

    fast_per = fast.seconds / args.iterations
    naive_per = naive.seconds / args.naive_iterations
    naive_s = naive_per * args.iterations
    summary = {
        "naive_s": round(naive_s, 3),
        "fast_s": round(fast.seconds, 3),
        "ratio": round(naive_s / fast.seconds, 1),
        "projected_40k_min": round(fast_per * FULL_ITERATIONS / 60.0, 2),
        "fast_ms_per_iteration": round(fast_per * 1e3, 3),
        "naive_ms_per_iteration": round(naive_per * 1e3, 3),
        "width": data.shape[1],
        "columns": "census-like mix" if width is not None else "all continuous",
        "discriminators": k,
        "iterations": args.iterations,
        "checkpoint_every": gan.checkpoint_every,
        "device": str(device),
        "profile": args.profile or "plain thesis hyperparameters",
        "kernels": kernels_in_use(gan, device),
        "critic_draw": gan.critic_draw,
        "critic_updates_per_drawn_critic": refresh_steps(gan),
    }
    return summary


if __name__ == "__main__":
    main()
