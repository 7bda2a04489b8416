"""Where and how GS-WGAN's loops run: the device, the C kernels or the tensor code
(`gan.kernels`, models/native/kernels.py), the precision of pretraining's products
(`gan.pretrain_matmul`) and torch's intra-op threads.

On a CPU with native bfloat16 the throwaway generators' products run in bfloat16 with float32
accumulation (`pretrain_matmul_dtype`), about twice as fast as float32 ones. Where they build, the C
kernels run all updates of a step's drawn critics, or of a pretraining chunk, in one call, and
pretraining's bfloat16 BatchNorm in one pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.native.kernels import use_native_batchnorm, use_native_critics


def resolve_device(device: str) -> torch.device:
    """The profile's `device`: "auto" takes CUDA where there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pretrain_matmul_dtype(gan: GanConfig, device: torch.device | str) -> torch.dtype | None:
    """The throwaway generators' product dtype (None: float32) for `gan.pretrain_matmul`. "auto" takes
    bfloat16 only on a CPU with native bfloat16 arithmetic, where it makes the largest products of
    pretraining about twice as fast; elsewhere bfloat16 is emulated and slower."""
    choice = gan.pretrain_matmul
    if choice == "auto":
        choice = "bfloat16" if torch.device(device).type == "cpu" and _cpu_has_native_bfloat16() else "float32"
    return torch.bfloat16 if choice == "bfloat16" else None


def _cpu_has_native_bfloat16() -> bool:
    try:  # oneDNN's own check (AVX512-BF16, AMX); a build without it has no native bfloat16 path
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def kernels_in_use(gan: GanConfig, device: torch.device | str) -> dict[str, str]:
    """What `gan.kernels` resolves to here, per inner loop ("native": the C kernels; "torch": tensor code)."""
    critics = use_native_critics(gan.kernels, gan.critic_hidden, gan.critic_batchnorm, device)
    batchnorm = use_native_batchnorm(gan.kernels, device, pretrain_matmul_dtype(gan, device))
    return {
        "critic_updates": "native" if critics else "torch",
        "pretrain_batchnorm": "native" if batchnorm else "torch",
    }


@contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
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
