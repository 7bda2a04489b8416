"""C kernels for the hottest inner loops on CPU, built on first use with the system's C compiler into one
shared library and loaded with ctypes; the tensor code (the Python loop for selection) is the reference
and the fallback. One C file per family: GS-WGAN's critics (gswgan_critic.c), the GS-WGAN generators'
BatchNorm (generator_batchnorm.c) and model selection's solver (logistic_selection.c); kernels.h declares
the entry points this module binds.

* `critic_updates`: r WGAN-GP updates with Adam of K critics without BatchNorm, in one call. A critic
  update of the thesis networks (16 -> 128 -> 1, B = 32) is about 30 tensor operations on a few thousand
  numbers each, so it costs the dispatch of those operations rather than their arithmetic (about 160 us
  per update on one CPU thread in training, 30 us per critic batched in pretraining); the C code takes
  about 16 us per update (63 us at 128 columns). It reads each step's rows where they lie (`CriticRows`:
  real rows by index into the table, fake rows shared by the drawn critics), so no [K, S, 2B, d] block is
  gathered and concatenated first. Adam's step uses refined reciprocal square roots and reciprocals
  (a few ulp of the step; the moments are torch's). Reference: `CriticStack.loss_grads_rows` +
  `StackedAdam`.
* `critic_input_grads`: training's query, each generated row's gradient through its own drawn critic,
  read in place in the stack (the tensor code gathers the drawn critics first). Reference:
  `CriticStack.input_grad`.
* `l1_cd`: coordinate descent on the d x d l1 sub-problem of logistic model selection
  (models/evaluation/selection/), float64, the Python loop's formulas and order; at an encoded width of
  128 it was 97% of a selection run.
  `logistic_margins` and `logistic_gradient`: selection's two passes over the data per Newton step, on
  float32 rows with float64 sums (half the bytes of numpy's float64 products, which are bound by memory),
  and `logistic_hessian`, its Hessian for narrow tables.
* `batchnorm_relu_bf16`: BatchNorm (training mode) + ReLU of pretraining's bfloat16 generator products,
  one pass over cache-resident rows instead of six mixed-precision tensor passes. Reference: the
  bfloat16 branch of `GeneratorStack.forward_train`.

They apply the tensor code's formulas in another summation order, so their results differ from it by
float32 rounding (tests/models/test_native_kernels.py bounds how much); the same seed on the same
machine still gives the same result.

`gan.kernels`: "torch" (the tensor code), "native" (the C code; an error if it cannot be built),
"auto" (the C code where it builds and applies: CPU, critics without BatchNorm; else the tensor code).

The library is built once per set of sources (every C file and the header: a changed one rebuilds),
compiler and CPU into `$DPSYNTH_NATIVE_CACHE` (default ~/.cache/dpsynth/native) with `$CC` (default cc),
`-O3 -march=native`: written under a temporary name and renamed, so concurrent processes never load a
half-written file.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from dpsynth.models.errors import ConfigError

_HERE = Path(__file__).parent
SOURCES = tuple(_HERE / name for name in ("gswgan_critic.c", "generator_batchnorm.c", "logistic_selection.c"))
HEADERS = (_HERE / "kernels.h",)
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-shared", "-fPIC"]
LANES = 16  # the C code's vector width along the hidden units
HESSIAN_MAX_D = 64  # logistic_hessian's widest table (logistic_selection.c)
CHOICES = ("auto", "native", "torch")

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_build_error: str | None = None


class NativeKernelError(ConfigError):
    """The C kernels could not be built or loaded (shown to the user when `kernels` is
    "native"; "auto" falls back to the tensor code instead)."""


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "\n".join(dict.fromkeys(keep))
    except OSError:
        return platform.processor() or platform.machine()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _cache_dir() -> Path:
    env = os.environ.get("DPSYNTH_NATIVE_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dpsynth" / "native"


def _library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    sources = [f"{path.name}\n{path.read_text()}" for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256(
        "\0".join([*sources, " ".join(FLAGS), compiler, version, platform.machine(), _cpu_signature()]).encode()
    ).hexdigest()[:20]
    return _cache_dir() / f"dpsynth-kernels-{key}.so"


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)  # the caller retries in a temporary folder if this fails
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *FLAGS, "-o", tmp, *map(str, SOURCES), "-lm"],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise NativeKernelError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> ctypes.CDLL:
    global _library, _build_error
    with _lock:
        if _library is not None:
            return _library
        if _build_error is not None:
            raise NativeKernelError(_build_error)
        try:
            compiler = _compiler()
            if compiler is None:
                raise NativeKernelError(f"no C compiler ({os.environ.get('CC', 'cc')}) on PATH")
            path = _library_path(compiler)
            if not path.exists():
                try:
                    _build(compiler, path)
                except NativeKernelError:
                    raise
                except OSError:  # an unwritable or read-only cache folder: build in a private temporary one
                    path = Path(tempfile.gettempdir()) / f"dpsynth-native-{os.getuid()}" / path.name
                    if not path.exists():
                        _build(compiler, path)
            lib = ctypes.CDLL(str(path))  # CDLL calls release the GIL: pretraining's threads run in parallel
        except (OSError, subprocess.SubprocessError, NativeKernelError) as exc:
            _build_error = (
                f"the C kernels (gan.kernels) are unavailable: {exc}. "
                "Use kernels 'auto' or 'torch' to train with the tensor code."
            )
            raise NativeKernelError(_build_error) from exc
        i64, dbl, ptr = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
        lib.critic_updates.argtypes = (
            [i64] * 5 + [ptr] * 10 + [ptr, ptr, i64, i64, ptr, i64, i64, ptr, ptr] + [dbl] * 5 + [ptr]
        )
        lib.critic_updates.restype = ctypes.c_int
        lib.critic_input_grads.argtypes = [i64] * 3 + [ptr] * 6
        lib.critic_input_grads.restype = ctypes.c_int
        lib.critic_step_grads.argtypes = [i64] * 3 + [ptr] * 5 + [dbl] + [ptr] * 4
        lib.critic_step_grads.restype = ctypes.c_int
        lib.batchnorm_relu_bf16.argtypes = [i64] * 4 + [ptr] * 3 + [dbl] + [ptr] * 4
        lib.batchnorm_relu_bf16.restype = ctypes.c_int
        lib.l1_cd.argtypes = [i64, ptr, ptr, ptr, dbl, i64, ptr, ptr]
        lib.l1_cd.restype = ctypes.c_int
        lib.logistic_margins.argtypes = [i64, i64, ptr, ptr, ptr]
        lib.logistic_margins.restype = None
        lib.logistic_gradient.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr]
        lib.logistic_gradient.restype = None
        lib.logistic_hessian.argtypes = [i64, i64, ptr, ptr, ptr]
        lib.logistic_hessian.restype = ctypes.c_int
        _library = lib
        return lib


def available() -> bool:
    """Whether the C kernels build and load here (built at the first call, then remembered)."""
    try:
        _load()
        return True
    except NativeKernelError:
        return False


def supports(hidden: int, batchnorm: bool, device: torch.device | str) -> bool:
    """Whether `critic_updates` computes these critics: on CPU, no BatchNorm, hidden width a multiple of 16."""
    return not batchnorm and torch.device(device).type == "cpu" and hidden % LANES == 0


def _check(choice: str) -> None:
    if choice not in CHOICES:
        raise ConfigError(f"gan.kernels must be one of {', '.join(CHOICES)}, not {choice!r}.")


def use_native_critics(choice: str, hidden: int, batchnorm: bool, device: torch.device | str) -> bool:
    """Resolve `gan.kernels` for the updates of critics with this hidden width."""
    _check(choice)
    if choice == "torch":
        return False
    if not supports(hidden, batchnorm, device):
        if choice == "native":
            raise ConfigError(
                "gan.kernels 'native' needs CPU critics without BatchNorm whose hidden width is a "
                f"multiple of {LANES}; use 'auto' or 'torch'."
            )
        return False
    if choice == "native":
        _load()  # raises NativeKernelError with the compiler's message
        return True
    return available()


def use_native_batchnorm(choice: str, device: torch.device | str, matmul_dtype: torch.dtype | None) -> bool:
    """Resolve `gan.kernels` for pretraining's generator BatchNorm: the C code covers the bfloat16
    products on CPU (where the tensor code's mixed-precision passes cost as much as the products)."""
    _check(choice)
    if choice == "torch" or matmul_dtype != torch.bfloat16 or torch.device(device).type != "cpu":
        return False
    if choice == "native":
        _load()
        return True
    return available()


def l1_cd(H: np.ndarray, u: np.ndarray, a: np.ndarray, tol: float, max_sweeps: int) -> tuple[bool, int]:
    """Coordinate descent sweeps on the l1 sub-problem of model selection (selection.l1_subproblem),
    in place on `u` and `a` (float64, contiguous; H [d, d]). Returns (converged, sweeps done)."""
    lib = _load()
    d = u.size
    for arr, shape in ((H, (d, d)), (u, (d,)), (a, (d,))):
        if arr.dtype != np.float64 or not arr.flags.c_contiguous or arr.shape != shape:
            raise ValueError("l1_cd takes contiguous float64 arrays H [d, d], u [d], a [d]")
    active = np.empty(d, dtype=np.int64)
    sweeps = ctypes.c_int64(0)
    converged = lib.l1_cd(
        d,
        H.ctypes.data,
        u.ctypes.data,
        a.ctypes.data,
        float(tol),
        int(max_sweeps),
        active.ctypes.data,
        ctypes.byref(sweeps),
    )
    return bool(converged), int(sweeps.value)


def _rows_and_vector(Xs: np.ndarray, v: np.ndarray, length: int) -> None:
    if Xs.dtype != np.float32 or not Xs.flags.f_contiguous or Xs.ndim != 2:
        raise ValueError("the logistic kernels take float32 rows [n, d] in Fortran (column) order")
    if v.dtype != np.float64 or not v.flags.c_contiguous or v.shape != (length,):
        raise ValueError(f"the logistic kernels take a contiguous float64 vector of {length}")


def logistic_margins(Xs: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Xs @ w in float64 for float32 rows Xs [n, d] (Fortran order) and a float64 w [d] (model selection)."""
    lib = _load()
    _rows_and_vector(Xs, w, Xs.shape[1])
    m = np.empty(Xs.shape[0])
    lib.logistic_margins(Xs.shape[0], Xs.shape[1], Xs.ctypes.data, w.ctypes.data, m.ctypes.data)
    return m


def logistic_gradient(Xs: np.ndarray, m: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(-(r @ Xs), r) in float64 for float32 rows Xs [n, d] (Fortran order), with r = sigmoid(-m) made
    from m and e = exp(-|m|) (float64 [n]) in the same call (model selection)."""
    lib = _load()
    _rows_and_vector(Xs, m, Xs.shape[0])
    _rows_and_vector(Xs, e, Xs.shape[0])
    r = np.empty(Xs.shape[0])
    g = np.empty(Xs.shape[1])
    lib.logistic_gradient(
        Xs.shape[0], Xs.shape[1], Xs.ctypes.data, m.ctypes.data, e.ctypes.data, r.ctypes.data, g.ctypes.data
    )
    return g, r


def logistic_hessian(Xs: np.ndarray, r: np.ndarray) -> np.ndarray:
    """X^T diag(r (1 - r)) X in float64 for float32 rows Xs [n, d] (Fortran order) and r [n], both
    triangles filled (model selection, narrow tables)."""
    lib = _load()
    _rows_and_vector(Xs, r, Xs.shape[0])
    d = Xs.shape[1]
    H = np.empty((d, d))
    if lib.logistic_hessian(Xs.shape[0], d, Xs.ctypes.data, r.ctypes.data, H.ctypes.data) != 0:
        raise ValueError(f"logistic_hessian takes at most {HESSIAN_MAX_D} columns, not {d}")
    upper = np.triu(H)
    return upper + np.triu(upper, 1).T


def _address(t: torch.Tensor) -> ctypes.c_void_p:
    if not t.is_contiguous() or t.dtype not in (torch.float32, torch.int64, torch.bfloat16) or t.device.type != "cpu":
        raise ValueError("the C kernels take contiguous CPU tensors")
    return ctypes.c_void_p(t.data_ptr())


@dataclasses.dataclass(frozen=True)
class CriticRows:
    """The rows of the C updates, read where they lie instead of copied into one [K, S, 2B, d] block:
    step s of the k-th critic uses the real rows data[real_rows[k, s]] (real_rows [K, S, B] int64) and
    the fake rows fakes[s] (fakes [S, B, d], `shared`: every critic sees the same fake batches) or
    fakes[k, s B:(s + 1) B] (fakes [K, M, d], M >= S B)."""

    data: torch.Tensor
    real_rows: torch.Tensor
    fakes: torch.Tensor
    shared: bool

    def __post_init__(self) -> None:
        if self.data.dtype != torch.float32 or self.fakes.dtype != torch.float32 or self.real_rows.dtype != torch.int64:
            raise ValueError("CriticRows: float32 rows and int64 row indices")
        k, steps, b = self.real_rows.shape
        # the C code reads data[real_rows] unchecked: every index must be a row of the table
        if self.real_rows.numel():
            low, high = (int(v) for v in torch.aminmax(self.real_rows))
            if low < 0 or high >= self.data.shape[0]:
                raise ValueError("CriticRows: real_rows must index rows of data")
        need = (steps, b) if self.shared else (k,)
        if (
            self.fakes.dim() != 3
            or tuple(self.fakes.shape[: len(need)]) != need
            or (not self.shared and self.fakes.shape[1] < steps * b)
            or self.fakes.shape[-1] != self.data.shape[1]
        ):
            raise ValueError("CriticRows: fakes do not match real_rows")

    def part(self, part: slice) -> CriticRows:
        """The rows of the critics at `part` of this call (a slice of checked rows: not checked again)."""
        sliced = object.__new__(CriticRows)
        for name, value in (
            ("data", self.data),
            ("real_rows", self.real_rows[part]),
            ("fakes", self.fakes if self.shared else self.fakes[part]),
            ("shared", self.shared),
        ):
            object.__setattr__(sliced, name, value)
        return sliced


def critic_updates(
    params: list[torch.Tensor],
    exp_avg: list[torch.Tensor],
    exp_avg_sq: list[torch.Tensor],
    done_steps: np.ndarray,
    rows: torch.Tensor | CriticRows,
    alpha: torch.Tensor,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    gp_lambda: float,
    wasserstein: bool = False,
    index: np.ndarray | None = None,
) -> torch.Tensor | None:
    """S WGAN-GP updates with Adam of each of K critics, in place: params [w1 [K,d,H], b1 [K,1,H],
    w2 [K,H,1], b2] (b2 is not trained) and their Adam moments (for w1, b1, w2), `done_steps` [K] the
    Adam steps each critic has taken (the caller adds S after the call); rows [K, S, 2B, d] (per step B
    real, then B fake rows) or a `CriticRows`, alpha [K, S, B, 1]. With `index` ([K] distinct positions
    in a larger stack) the k-th critic updated is params[...][index[k]], in place; rows, alpha and
    done_steps stay [K]. Returns, when asked, each critic's estimate mean D(real) - mean D(fake) at its
    last step before that update ([K])."""
    lib = _load()
    w1, b1, w2 = params[:3]
    # the real rows, their row index (None: the rows lie in consecutive blocks), the strides per critic and step
    real_at: tuple[ctypes.c_void_p, ctypes.c_void_p | None, int, int]
    if isinstance(rows, CriticRows):
        k, steps, b = rows.real_rows.shape
        width = rows.data.shape[1]
        real, real_rows, fakes = rows.data.contiguous(), rows.real_rows.contiguous(), rows.fakes.contiguous()
        # strides in rows: real rows by index; fake rows per critic (0: shared) and per step
        real_at = (_address(real), _address(real_rows), 0, 0)
        fake_at = (_address(fakes), 0 if rows.shared else fakes.shape[1], b)
    else:
        k, steps, two_b, width = rows.shape
        b = two_b // 2
        rows = rows.contiguous()
        real_at = (_address(rows), None, steps * two_b, two_b)
        fake_at = (ctypes.c_void_p(rows.data_ptr() + b * width * rows.element_size()), steps * two_b, two_b)
    steps_done = torch.from_numpy(np.ascontiguousarray(done_steps, dtype=np.int64))
    positions = None
    if index is not None:
        index = np.ascontiguousarray(index, dtype=np.int64)
        if index.size != k or (k and (index.min() < 0 or index.max() >= w1.shape[0])):
            raise ValueError("critic_updates: index must hold one position of the stack per critic")
        positions = torch.from_numpy(index)
    elif w1.shape[0] < k:
        raise ValueError("critic_updates: more critics in rows than in params")
    out = torch.empty(k) if wasserstein else None
    code = lib.critic_updates(
        k,
        steps,
        b,
        width,
        w1.shape[-1],
        _address(positions) if positions is not None else None,
        _address(w1),
        _address(b1),
        _address(w2),
        _address(exp_avg[0]),
        _address(exp_avg_sq[0]),
        _address(exp_avg[1]),
        _address(exp_avg_sq[1]),
        _address(exp_avg[2]),
        _address(exp_avg_sq[2]),
        *real_at,
        *fake_at,
        _address(alpha),
        _address(steps_done),
        float(lr),
        float(betas[0]),
        float(betas[1]),
        float(eps),
        float(gp_lambda),
        _address(out) if out is not None else None,
    )
    if code != 0:
        raise RuntimeError(f"a C kernel failed (code {code})")
    return out


def critic_input_grads(params: list[torch.Tensor], index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Row i's gradient of critic index[i]'s score with respect to row i, for rows [n, d], reading the
    critics (params [w1 [K,d,H], b1 [K,1,H], w2 [K,H,1], b2]) in place: `CriticStack.input_grad` on
    gathered critics, without gathering them."""
    w1, b1, w2 = params[:3]
    if rows.dtype != torch.float32 or rows.dim() != 2 or rows.shape[1] != w1.shape[1]:
        raise ValueError("critic_input_grads: float32 rows [n, d] of the critics' width")
    positions = index.to(dtype=torch.int64).contiguous()
    if positions.numel() != rows.shape[0] or int(positions.min()) < 0 or int(positions.max()) >= w1.shape[0]:
        raise ValueError("critic_input_grads: one critic position of the stack per row")
    rows = rows.contiguous()
    out = torch.empty_like(rows)
    code = _load().critic_input_grads(
        rows.shape[0],
        rows.shape[1],
        w1.shape[-1],
        _address(positions),
        _address(w1),
        _address(b1),
        _address(w2),
        _address(rows),
        _address(out),
    )
    if code != 0:
        raise RuntimeError(f"a C kernel failed (code {code})")
    return out


def step_gradients(
    params: list[torch.Tensor], rows: torch.Tensor, alpha: torch.Tensor, gp_lambda: float
) -> tuple[list[torch.Tensor], float]:
    """The C code's gradients for one step of one critic (params [w1 [1,d,H], b1, w2, b2], rows [2B, d],
    alpha [B, 1]), shaped like `CriticStack.loss_grads_rows`'s, and its Wasserstein estimate: for tests."""
    lib = _load()
    w1, b1, w2 = (p.contiguous() for p in params[:3])
    grads = [torch.empty_like(w1), torch.empty_like(b1), torch.empty_like(w2)]
    estimate = torch.empty(1)
    code = lib.critic_step_grads(
        rows.shape[0] // 2,
        rows.shape[1],
        w1.shape[-1],
        _address(w1),
        _address(b1),
        _address(w2),
        _address(rows.contiguous()),
        _address(alpha.contiguous()),
        float(gp_lambda),
        *(_address(g) for g in grads),
        _address(estimate),
    )
    if code != 0:
        raise RuntimeError(f"a C kernel failed (code {code})")
    return grads, float(estimate)


def batchnorm_relu_bf16(
    y: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    last: torch.Tensor,
    xhat: torch.Tensor,
    scale: torch.Tensor,
) -> None:
    """BatchNorm over each chunk's rows + ReLU of y [K, C, B, W] (bfloat16) with gamma, beta [K, 1, W]:
    out [K, C, B, W] (bfloat16); for the last chunk also last (the ReLU output), xhat and scale
    (rstd * gamma, [K, 1, W]) in float32, [K, B, W]. Written in place."""
    k, chunks, batch, width = y.shape
    code = _load().batchnorm_relu_bf16(
        k,
        chunks,
        batch,
        width,
        _address(y),
        _address(gamma.contiguous()),
        _address(beta.contiguous()),
        float(eps),
        _address(out),
        _address(last),
        _address(xhat),
        _address(scale),
    )
    if code != 0:
        raise RuntimeError(f"a C kernel failed (code {code})")
