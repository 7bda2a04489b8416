"""DP-SGD's clipped sum without each row's gradient written out ("ghost clipping": Goodfellow 2015, Li,
Tramer, Liang and Hashimoto 2022; Opacus calls it fast gradient clipping), for networks whose weights all
sit in `nn.Linear` and `nn.LayerNorm` layers applied to [rows, features] inputs.

Why: `dpsgd.per_example_gradients` (vmap of grad) writes rows x parameters numbers per batch. DP-SGD's
Poisson batch is a fixed share of the rows, so at a million rows one autoencoder batch of 8,000 rows held
3 GB of per-row gradients and a release spent 17 minutes writing and re-reading them. Here a Linear
layer's row gradient sum_u delta_u a_u^T (a_u its input and delta_u the row loss's gradient at its
output, in each of its U uses) is never formed: its squared norm is sum_{u,v} (delta_u . delta_v)
(a_u . a_v), and the clipped sum is sum_u (c delta_u)^T a_u, one matrix product. LayerNorm's row
gradients (2 h numbers a row) are formed. Memory and time grow with rows x layer widths, not rows x
parameters.

The mechanism is the same as `dpsgd.clipped_sum(per_example_gradients(...))` computes, to float
rounding: each row's gradient over ALL parameters together gets one norm, is scaled to at most `clip`,
and a row whose gradient holds a NaN or an infinity (or whose norm overflows) contributes zero
(models/generators/sanitizer.py). tests/models/test_ghost_clipping.py compares the two on the networks
that use this.

What it assumes, and checks where it can: row i's loss depends on row i's inputs only (the same rows of
every use), so the gradient of the summed loss at a layer's output is, row by row, each row's own. Only
`ROW_LOCAL` modules may appear (no BatchNorm, no dropout: a module outside the list is refused), and
every parameter must belong to a Linear or LayerNorm layer.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.models.generators.networks import OutputHead

# Modules whose output row depends on its own input row only (and, for Linear and LayerNorm, whose
# parameters this module knows how to differentiate per row). Containers add no computation of their own
# beyond calling these: their forward code is what tests compare against per-row gradients.
PARAMETRISED = (nn.Linear, nn.LayerNorm)
ROW_LOCAL = PARAMETRISED + (nn.LeakyReLU, nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Identity, OutputHead)
# Added to a row's norm before dividing by it, as in dpsgd.clipped_sum.
NORM_EPS = 1e-6


class _Uses:
    """What one parametrised layer saw in each use during the loss's forward pass: its input rows and its
    output (whose gradient is the row-wise delta)."""

    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []


def check_ghost_supported(module: nn.Module) -> None:
    """Raise ValueError unless every submodule is `ROW_LOCAL` or a plain container, and every trainable
    parameter belongs to a Linear or LayerNorm layer."""
    for name, sub in module.named_modules():
        own = list(sub.parameters(recurse=False))
        if isinstance(sub, ROW_LOCAL):
            if getattr(sub, "inplace", False):  # would overwrite the layer outputs whose gradients are read
                raise ValueError(f"ghost clipping: {name!r} works in place")
            if isinstance(sub, nn.LayerNorm) and len(sub.normalized_shape) != 1:
                raise ValueError(f"ghost clipping: LayerNorm {name!r} must normalise one dimension")
            continue
        if own:
            raise ValueError(f"ghost clipping: {name!r} ({type(sub).__name__}) holds parameters of an unsupported kind")
        if not list(sub.children()):
            raise ValueError(f"ghost clipping: {name!r} ({type(sub).__name__}) is not known to be row-local")


@contextmanager
def _recording(module: nn.Module):
    layers = {name: sub for name, sub in module.named_modules() if isinstance(sub, PARAMETRISED)}
    uses = {name: _Uses() for name in layers}
    handles = []

    def hook_for(name: str):
        def hook(_mod, args, output):
            (x,) = args
            if x.dim() != 2:
                raise ValueError(f"ghost clipping: layer {name!r} must read [rows, features], got {tuple(x.shape)}")
            uses[name].inputs.append(x.detach())
            uses[name].outputs.append(output)

        return hook

    for name, layer in layers.items():
        handles.append(layer.register_forward_hook(hook_for(name)))
    try:
        yield layers, uses
    finally:
        for h in handles:
            h.remove()


def ghost_clipped_sum(
    module: nn.Module, row_losses: Callable[[], torch.Tensor], clip: float
) -> dict[str, torch.Tensor]:
    """Sum over rows of each row's gradient of `row_losses()` (one loss per row, computed through `module`)
    scaled to L2 norm at most `clip` over all trainable parameters together; keys and order as
    `module.named_parameters()` (trainable ones), as `dpsgd.clipped_sum` gives them."""
    check_ghost_supported(module)
    params = {k: v for k, v in module.named_parameters() if v.requires_grad}
    with _recording(module) as (layers, uses):
        with torch.enable_grad():
            losses = row_losses()
        if losses.dim() != 1:
            raise ValueError(f"ghost clipping: one loss per row expected, got shape {tuple(losses.shape)}")
        n = losses.shape[0]
        flat = [(name, u) for name, use in uses.items() for u in range(len(use.outputs))]
        wanted = [uses[name].outputs[u] for name, u in flat]
        deltas_flat = torch.autograd.grad(losses.sum(), wanted, allow_unused=True, materialize_grads=True) if n else []
    if n == 0:
        return {k: torch.zeros_like(v) for k, v in params.items()}
    deltas: dict[str, list[torch.Tensor]] = {name: [] for name in uses}
    for (name, _), d in zip(flat, deltas_flat, strict=True):
        deltas[name].append(d.detach())

    pieces = {name: _LayerPieces(layers[name], uses[name].inputs, deltas[name]) for name in layers if deltas[name]}
    factors = clip_factors({name: piece.squared_norms() for name, piece in pieces.items()}, clip) if pieces else {}

    summed: dict[str, torch.Tensor] = {}
    for name, layer in layers.items():
        sums = pieces[name].weighted_sums(factors[name]) if name in pieces else {}
        for suffix, param in layer.named_parameters(recurse=False):
            # A layer the loss never ran through has a zero gradient in every row.
            summed[f"{name}.{suffix}" if name else suffix] = sums.get(suffix, torch.zeros_like(param))
    return {k: summed[k] for k in params}


def clip_factors(squared: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """Each layer's factor per row (`squared`: each layer's squared row norms): the same for every layer,
    min(1, C / ||g_i||) with ||g_i|| the row's norm over ALL layers together, since DP-SGD's sensitivity is
    that of the whole gradient (clipping each layer to C on its own would let a row move the sum by C times
    the square root of the layer count). A row whose norm is not a number or infinite gets 0: every input
    and output gradient entry the sums read enters the norm squared, so a NaN or an infinity anywhere in
    the row shows there (0 x inf is NaN), as does a norm that overflows."""
    total = sum(squared.values(), torch.zeros(next(iter(squared.values())).shape[0]))
    ok = torch.isfinite(total)
    factor = torch.where(ok, (clip / (torch.where(ok, total, 0.0).sqrt() + NORM_EPS)).clamp(max=1.0), 0.0)
    return {name: factor for name in squared}


class _LayerPieces:
    """One layer's row-wise quantities: for Linear the inputs and deltas of each use (never multiplied out),
    for LayerNorm the per-row gradients themselves."""

    def __init__(self, layer: nn.Module, inputs: list[torch.Tensor], deltas: list[torch.Tensor]):
        self.layer = layer
        self.inputs = inputs
        self.deltas = deltas
        self.rows: dict[str, torch.Tensor] = {}  # LayerNorm: parameter suffix -> [n, h]
        if isinstance(layer, nn.LayerNorm):
            normalised = [F.layer_norm(x, layer.normalized_shape, None, None, layer.eps) for x in inputs]
            if layer.weight is not None and layer.weight.requires_grad:
                self.rows["weight"] = sum(d * x for d, x in zip(deltas, normalised, strict=True))  # type: ignore[assignment]
            if layer.bias is not None and layer.bias.requires_grad:
                self.rows["bias"] = sum(deltas)  # type: ignore[assignment]

    @property
    def linear(self) -> bool:
        return isinstance(self.layer, nn.Linear)

    def squared_norms(self) -> torch.Tensor:
        n = self.deltas[0].shape[0]
        if not self.linear:
            return sum((g.square().sum(dim=1) for g in self.rows.values()), torch.zeros(n))
        total = torch.zeros(n)
        if self.layer.weight.requires_grad:
            uses = len(self.deltas)
            for u in range(uses):
                for v in range(u, uses):
                    term = (self.deltas[u] * self.deltas[v]).sum(1) * (self.inputs[u] * self.inputs[v]).sum(1)
                    total = total + (term if u == v else 2.0 * term)
        if self.layer.bias is not None and self.layer.bias.requires_grad:
            total = total + sum(self.deltas).square().sum(1)  # type: ignore[union-attr]
        return total

    def weighted_sums(self, factors: torch.Tensor) -> dict[str, torch.Tensor]:
        """sum_i factor_i g_i per parameter. Rows of factor 0 are zeroed first where there are any: such a
        row may hold a NaN or an infinity, and 0 x inf is NaN."""
        zeroed = bool((factors == 0).any())

        def kept(t: torch.Tensor) -> torch.Tensor:
            return torch.where((factors != 0)[:, None], t, 0.0) if zeroed else t

        if not self.linear:
            return {k: (factors[:, None] * kept(g)).sum(0) for k, g in self.rows.items()}
        out = {}
        deltas = [kept(d) * factors[:, None] for d in self.deltas]
        if self.layer.weight.requires_grad:
            out["weight"] = sum(d.T @ kept(a) for d, a in zip(deltas, self.inputs, strict=True))
        if self.layer.bias is not None and self.layer.bias.requires_grad:
            out["bias"] = sum(d.sum(0) for d in deltas)
        return out  # type: ignore[return-value]


def discriminator_clipped_sum(
    disc: nn.Module, rows: torch.Tensor, condition: torch.Tensor, real: bool, clip: float
) -> dict[str, torch.Tensor]:
    """A conditional discriminator's clipped sum (DP-CGAN's and DP-Fed-CTGAN's, real or generated rows
    clipped on their own): each row's gradient of its own loss, -log D for a real row and -log(1 - D) for a
    generated one (binary cross entropy on the row's logit `disc(rows, condition)`), scaled to at most
    `clip`."""
    target = torch.full((rows.shape[0],), 1.0 if real else 0.0, dtype=rows.dtype)
    return ghost_clipped_sum(
        disc, lambda: F.binary_cross_entropy_with_logits(disc(rows, condition), target, reduction="none"), clip
    )
