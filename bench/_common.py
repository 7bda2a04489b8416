"""Shared pieces of the GS-WGAN benchmarks (bench/pretrain.py, bench/train.py): data, naive reference
networks written the plain way (nn.Module + torch.optim.Adam + autograd, as the official GS-WGAN code),
command line and the JSON summary line."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.devices import resolve_device
from dpsynth.models.generators.gswgan.generator_files import target_condition
from dpsynth.models.generators.networks import Generator
from dpsynth.models.privacy.secret import PrivacySecret

ROWS = 56_000  # Cardio's training split (0.8 of 70,000)
WIDTH = 16  # Cardio's encoded width


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--discriminators", "-k", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--profile",
        default=None,
        help="take the generator/critic settings from this profile (e.g. thesis: conditioned "
        "on the target, Gumbel head, 50 critic updates per visit, EMA); default: the "
        "thesis' plain hyperparameters (Tanh head, r = 5)",
    )
    return ap


# The benchmarks' random table has no schema: its first column plays a binary target.
TARGET_COLUMN = 0
BENCH_GROUPS = [(0, 1, "binary")] + [(i, i + 1, "continuous") for i in range(1, WIDTH)]


def bench_groups(width: int | None) -> list[tuple[int, int, str]]:
    """Encoded blocks of the benchmark table: None, Cardio's width with every feature continuous (the
    default); a width, the census-like column mix of bench/_layout.py (one-hot groups up to 42 levels)."""
    if width is None:
        return BENCH_GROUPS
    from bench._layout import head_groups

    return head_groups(width)


def add_width_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--width",
        type=int,
        nargs="+",
        default=None,
        help="encoded widths of census-like tables to time in turn (e.g. 16 64 128 256); "
        "default: Cardio's 16 columns, all continuous",
    )


def emit_widths(summaries: list[dict], quiet: bool) -> dict:
    """One width: its summary as usual. Several: each printed, then {"widths": [...]} as the last line."""
    if len(summaries) == 1:
        emit(summaries[0], quiet)
        return summaries[0]
    if not quiet:
        for summary in summaries:
            print(json.dumps(summary))
    combined = {"widths": summaries}
    print(json.dumps(combined), flush=True)
    return combined


def bench_gan(profile: str | None, **overrides) -> GanConfig:
    """The GAN settings a benchmark times: a profile's (configs/profiles/NAME.yaml), or the defaults."""
    gan = GanConfig()
    if profile is not None:
        from dpsynth.models.config import load_profile

        root = Path(__file__).resolve().parent.parent
        gan = load_profile(profile, root / "configs" / "cardio.yaml").gan
    return gan.replace(**overrides)


def bench_condition(gan: GanConfig):
    return target_condition(gan, TARGET_COLUMN, "binary")


def refresh_steps(gan: GanConfig) -> int:
    """Critic updates each drawn critic gets per generator step in Algorithm 2."""
    return gan.critic_refresh_steps or gan.critic_steps


def bench_secret(seed: int) -> PrivacySecret:
    """A fixed privacy secret: benchmarks time arithmetic, and must repeat (a release draws its own)."""
    return PrivacySecret.from_hex(f"{seed:064x}")


def device_of(name: str) -> torch.device:
    return resolve_device(name)


def make_data(seed: int, rows: int = ROWS, width: int = WIDTH) -> torch.Tensor:
    """Rows in [-1, 1] of the encoded width (the benchmarks time arithmetic, not what is learnt)."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.uniform(-1.0, 1.0, size=(rows, width)).astype(np.float32))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Timer:
    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        sync(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.seconds = time.perf_counter() - self.start


def naive_critic(gan: GanConfig, width: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(width, gan.critic_hidden)]
    if gan.critic_batchnorm:
        layers.append(nn.BatchNorm1d(gan.critic_hidden))
    layers += [nn.LeakyReLU(0.2), nn.Linear(gan.critic_hidden, 1)]
    return nn.Sequential(*layers)


def naive_generator(gan: GanConfig, groups: list[tuple[int, int, str]]) -> nn.Module:
    """The released generator's module (its head and conditioning as configured); draw its inputs with
    `.latent(n, torch.default_generator)`."""
    return Generator(
        gan.z_dim, tuple(gan.generator_hidden), groups[-1][1], gan.output_head, groups, bench_condition(gan)
    )


def naive_gradient_penalty(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    alpha = torch.rand(real.shape[0], 1, device=real.device)
    x_hat = (alpha * real + (1.0 - alpha) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=True)
    return ((grad.norm(dim=1) - 1.0) ** 2).mean()


def naive_critic_step(
    critic: nn.Module, opt: torch.optim.Optimizer, real: torch.Tensor, fake: torch.Tensor, gp_lambda: float
) -> float:
    opt.zero_grad(set_to_none=True)
    d_real, d_fake = critic(real).mean(), critic(fake).mean()
    loss = d_fake - d_real + gp_lambda * naive_gradient_penalty(critic, real, fake)
    loss.backward()
    opt.step()
    return float((d_real - d_fake).detach())


def emit(summary: dict, quiet: bool) -> None:
    """The JSON object is always the last line of standard output."""
    if not quiet:
        for key, value in summary.items():
            print(f"  {key}: {value}")
    print(json.dumps(summary), flush=True)
