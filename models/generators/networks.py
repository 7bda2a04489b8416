"""Networks of GS-WGAN for tables (thesis 4.4).

`Generator` is the released model: z -> fully connected hidden layers with BatchNorm and ReLU -> an output
of the encoded width. Critics and pretraining's throwaway generators are kept as *stacks*: one tensor
per layer with a leading dimension of K (or of a chunk of K), so that many independent networks train
together through batched matrix products instead of a Python loop over networks.

Speed notes. The stacks carry hand-written forward and backward passes instead of autograd:

* A critic without BatchNorm is piecewise linear in its input, so the WGAN-GP loss has a closed-form
  gradient (`CriticStack.loss_grads`): the gradient penalty's second derivative through LeakyReLU is zero
  almost everywhere, exactly as autograd's double backward computes it. A critic with BatchNorm mixes the
  rows of a batch inside the penalty; it falls back to autograd (same results, slower).
* The throwaway generators' backward (`GeneratorStack.backward`) uses the BatchNorm gradient in its
  compact form dY = gamma * rstd * (dZ - mean(dZ) - xhat * mean(dZ * xhat)).
* The bias of a Linear layer followed by training-mode BatchNorm has no effect on any output (the batch
  mean removes it) and its true gradient is zero: the throwaway generators neither apply nor train it.
  The same holds for the critic's output bias, which cancels in E[D(fake)] - E[D(real)] and does not
  enter the gradient penalty: it is never trained (Adam with a zero gradient leaves it unchanged).
* The critic's first layer is affine, so at x_hat = alpha real + (1 - alpha) fake it is the same
  interpolation of its values at the real and fake rows: the gradient penalty needs no product with w1.
* Reductions over the rows of a batch avoid `torch.var` (slow on CPU): two-pass mean and centred square.
* Large temporaries go to reused `Workspace` buffers (a fresh large allocation costs page faults).

The tests check these passes against autograd and `torch.optim.Adam` on per-network `nn.Module`s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.models.native.kernels import batchnorm_relu_bf16

BN_EPS = 1e-5
LEAKY_SLOPE = 0.2


# A block of encoded columns as the output head sees it: (start, stop), or (start, stop, kind) as
# `TableEncoder.head_groups` gives it (the kind tells a binary column from a continuous one).
HeadGroup: TypeAlias = tuple[int, int] | tuple[int, int, str]

# Temperature of the "gumbel" head's relaxed samples (CTGAN's Gumbel-softmax uses 0.2).
GUMBEL_TAU = 0.2
_UNIFORM_EPS = 1e-6


def one_hot_groups(groups) -> list[tuple[int, int]]:
    """The (start, stop) of every one-hot group (blocks of more than one encoded column)."""
    return [(g[0], g[1]) for g in groups if g[1] - g[0] > 1]


def binary_columns(groups) -> list[int]:
    """Encoded columns of binary blocks: groups may be (start, stop, kind) triples (see
    `dpsynth.models.data.encoding.TableEncoder.head_groups`); plain (start, stop) pairs carry no kind."""
    return [g[0] for g in groups if len(g) > 2 and g[2] == "binary"]


def head_noise_width(kind: str, out_width: int) -> int:
    """Latent entries the head consumes: one uniform per encoded column for "gumbel", else none."""
    return out_width if kind == "gumbel" else 0


class OutputHead(nn.Module):
    """Maps logits to rows in [-1, 1]; see `apply_head` for the kinds."""

    def __init__(self, kind: str, groups):
        super().__init__()
        self.kind = kind
        self.groups = [tuple(g) for g in groups]

    def forward(self, logits: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        return apply_head(logits, self.kind, self.groups, noise)


def apply_head(logits: torch.Tensor, kind: str, groups, noise: torch.Tensor | None = None) -> torch.Tensor:
    """ "tanh": Tanh for every encoded column (thesis). "typed": Tanh for single columns and a softmax
    mapped to [-1, 1] over each one-hot group. "gumbel" (CTGAN-style relaxed sampling): Tanh for
    continuous columns; each one-hot group a Gumbel-softmax sample 2 softmax((a + G) / tau) - 1 and each
    binary column a relaxed Bernoulli sample tanh((a + L) / (2 tau)), whose sign is +1 with probability
    sigmoid(a). `noise` holds one Uniform(0, 1) per encoded column (the latent's last entries): G and L
    are made from it. Relaxed samples look like the real rows' hard +-1 values, so the critic gives no
    reward for saturating the logits themselves (saturated Tanh or softmax outputs are absorbing: their
    gradient vanishes and a column stays at one level)."""
    out = torch.tanh(logits)
    multi = one_hot_groups(groups)
    if kind == "gumbel":
        if noise is None:
            raise ValueError('the "gumbel" head needs its noise: one Uniform(0, 1) per encoded column')
        u = noise.clamp(_UNIFORM_EPS, 1.0 - _UNIFORM_EPS)
        binary = binary_columns(groups)
        if binary:
            idx = torch.tensor(binary, device=logits.device)
            logistic = torch.log(u[..., idx]) - torch.log1p(-u[..., idx])
            out = out.index_copy(-1, idx, torch.tanh((logits[..., idx] + logistic) / (2.0 * GUMBEL_TAU)))
    if kind in ("typed", "gumbel") and multi:
        parts, last = [], 0
        for start, stop in multi:
            a = logits[..., start:stop]
            if kind == "gumbel":
                a = (a - torch.log(-torch.log(u[..., start:stop]))) / GUMBEL_TAU
            parts.append(out[..., last:start])
            parts.append(2.0 * torch.softmax(a, dim=-1) - 1.0)
            last = stop
        parts.append(out[..., last:])
        out = torch.cat(parts, dim=-1)
    return out


def head_backward(out: torch.Tensor, dout: torch.Tensor, kind: str, groups) -> torch.Tensor:
    """Gradient with respect to the logits of `apply_head`, given its output and the output's gradient
    (the noise enters only through `out`)."""
    dlogits = dout * (1.0 - out * out)
    if kind == "gumbel":
        binary = binary_columns(groups)
        if binary:
            dlogits[..., binary] *= 1.0 / (2.0 * GUMBEL_TAU)
    if kind in ("typed", "gumbel"):
        scale = 2.0 / GUMBEL_TAU if kind == "gumbel" else 2.0
        for start, stop in one_hot_groups(groups):
            p = (out[..., start:stop] + 1.0) * 0.5
            g = dout[..., start:stop]
            dlogits[..., start:stop] = scale * p * (g - (g * p).sum(-1, keepdim=True))
    return dlogits


def draw_latent(
    shape: tuple[int, ...], z_dim: int, condition: tuple[int, float] | None, rng: torch.Generator, noise_width: int = 0
) -> torch.Tensor:
    """Generator inputs of shape `shape + (latent width,)`, drawn in this order and laid out as:
    z ~ N(0, I) (z_dim entries); for a conditional generator one label, +1 with probability
    `condition[1]` and -1 otherwise; then `noise_width` Uniform(0, 1) entries for the head. A plain
    draw is exactly `torch.randn(shape + (z_dim,))`."""
    shape = tuple(shape)
    parts = [torch.randn(shape + (z_dim,), generator=rng, device=rng.device)]
    if condition is not None:
        label = torch.rand(shape + (1,), generator=rng, device=rng.device) < condition[1]
        parts.append(label.to(parts[0].dtype).mul_(2.0).sub_(1.0))
    if noise_width:
        parts.append(torch.rand(shape + (noise_width,), generator=rng, device=rng.device))
    return parts[0] if len(parts) == 1 else torch.cat(parts, -1)


class LatentLayout:
    """Where z, the label and the head's noise sit in a latent row (see `draw_latent`)."""

    def __init__(self, z_dim: int, condition: tuple[int, float] | None, noise_width: int):
        self.z_dim, self.condition, self.noise_width = z_dim, condition, noise_width
        self.body_width = z_dim + (1 if condition is not None else 0)  # what the first layer reads

    def body(self, latent: torch.Tensor) -> torch.Tensor:
        return latent[..., : self.body_width] if self.noise_width else latent

    def noise(self, latent: torch.Tensor) -> torch.Tensor | None:
        return latent[..., self.body_width :] if self.noise_width else None

    def impose_label_(self, out: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """Write the label into the target's encoded column, in place. The column is then +-1, so the
        head's derivative there is 0: no gradient reaches its logit."""
        if self.condition is not None:
            out[..., self.condition[0]] = latent[..., self.z_dim]
        return out

    def with_label(self, out: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """`impose_label_` for autograd: a new tensor, no gradient through the label column."""
        if self.condition is None:
            return out
        column = torch.zeros(out.shape[-1], dtype=torch.bool, device=out.device)
        column[self.condition[0]] = True
        return torch.where(column, latent[..., self.z_dim : self.z_dim + 1], out)


class Generator(nn.Module):
    """`condition` = (target column in the encoded row, probability of the target's second level) makes
    a conditional generator (official GS-WGAN conditions on the class label): its input is z plus a
    +-1 label, and the label is copied into the target's column of every generated row. The "gumbel"
    head also reads one uniform per encoded column from the latent (`draw_latent`)."""

    def __init__(
        self,
        z_dim: int,
        hidden: tuple[int, ...],
        out_width: int,
        head: str = "tanh",
        groups: Sequence[HeadGroup] | None = None,
        condition: tuple[int, float] | None = None,
    ):
        super().__init__()
        self.z_dim = z_dim
        self.out_width = out_width
        self.condition = (int(condition[0]), float(condition[1])) if condition is not None else None
        self.layout = LatentLayout(z_dim, self.condition, head_noise_width(head, out_width))
        layers, width = [], self.layout.body_width
        for h in hidden:
            layers += [nn.Linear(width, h), nn.BatchNorm1d(h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, out_width))
        self.body = nn.Sequential(*layers)
        self.head = OutputHead(head, groups or [])

    def latent(self, n_rows: int, rng: torch.Generator) -> torch.Tensor:
        """n_rows generator inputs (z, the label if conditional, the head's noise), drawn from `rng`."""
        layout = self.layout
        return draw_latent((n_rows,), self.z_dim, self.condition, rng, layout.noise_width)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        layout = self.layout
        return layout.with_label(self.head(self.body(layout.body(z)), layout.noise(z)), z)

    @torch.no_grad()
    def forward_chunks(self, z: torch.Tensor, chunks: int) -> torch.Tensor:
        """`chunks` training-mode calls on consecutive equal slices of z, in one pass and without autograd.

        Each slice is normalised with its own batch statistics, and the BatchNorm running statistics end
        as after `chunks` sequential calls (same momentum updates, combined in closed form), so this equals
        `torch.cat([self(part) for part in z.chunk(chunks)])` up to float rounding.
        """
        rows = z.shape[0]
        if rows % chunks or not self.training:
            raise ValueError("forward_chunks is for training mode, with rows a multiple of chunks")
        batch = rows // chunks
        mods = list(self.body)
        layout = self.layout
        h = layout.body(z)
        for i in range(0, len(mods) - 1, 3):
            lin, bn = mods[i], mods[i + 1]
            assert isinstance(lin, nn.Linear) and isinstance(bn, nn.BatchNorm1d)  # the body `__init__` builds
            # The Linear's bias only shifts the batch mean (BatchNorm removes it): added to the mean only.
            y = torch.mm(h, lin.weight.t())
            width = y.shape[1]
            yv = y.view(chunks, batch, width)
            mean = yv.mean(1, keepdim=True)
            yv.sub_(mean)
            sq = (yv * yv).sum(1, keepdim=True)
            if bn.track_running_stats:
                _update_running_stats(bn, mean.view(chunks, width).add_(lin.bias), sq.view(chunks, width), batch)
            scale = sq.mul_(1.0 / batch).add_(bn.eps).rsqrt_()
            if bn.affine:
                torch.addcmul(bn.bias, yv, scale.mul_(bn.weight), out=yv)
            else:
                yv.mul_(scale)
            h = y.relu_()
        out = mods[-1]
        assert isinstance(out, nn.Linear)
        logits = torch.addmm(out.bias, h, out.weight.t())
        return layout.impose_label_(self.head(logits, layout.noise(z)), z)


def _update_running_stats(bn: nn.BatchNorm1d, means: torch.Tensor, centred_sq: torch.Tensor, batch: int) -> None:
    """BatchNorm's running-statistics update for `len(means)` consecutive training-mode batches (the
    unbiased variance, as BatchNorm keeps)."""
    running_mean, running_var, tracked = bn.running_mean, bn.running_var, bn.num_batches_tracked
    if running_mean is None or running_var is None or tracked is None:
        raise ValueError("a BatchNorm without running statistics has none to update")
    chunks = means.shape[0]
    if bn.momentum is None:  # cumulative moving average: apply the calls one by one
        unbiased = centred_sq / max(batch - 1, 1)
        for j in range(chunks):
            tracked.add_(1)
            factor = 1.0 / float(tracked)
            running_mean.lerp_(means[j], factor)
            running_var.lerp_(unbiased[j], factor)
        return
    m = bn.momentum
    weights = _momentum_weights(chunks, m, batch, means.dtype, means.device)
    keep = (1.0 - m) ** chunks
    running_mean.addmv_(means.t(), weights[0], beta=keep)
    running_var.addmv_(centred_sq.t(), weights[1], beta=keep)
    tracked.add_(chunks)


_CONSTANTS: dict = {}  # small constant tensors, by (name, shape parameters, dtype, device)


def _momentum_weights(chunks: int, momentum: float, batch: int, dtype, device) -> torch.Tensor:
    """Weights of `chunks` consecutive batch statistics in the running statistics: row 0 for the means,
    row 1 for centred sums of squares (the unbiased variance's 1 / (B - 1) folded in)."""
    key = ("momentum", chunks, momentum, batch, dtype, str(device))
    w = _CONSTANTS.get(key)
    if w is None:
        w = torch.tensor([momentum * (1.0 - momentum) ** (chunks - 1 - j) for j in range(chunks)], dtype=torch.float64)
        w = torch.stack([w, w / max(batch - 1, 1)]).to(dtype=dtype, device=device)
        _CONSTANTS[key] = w
    return w


def init_generator_(gen: nn.Module, scheme: str, rng: torch.Generator) -> None:
    """ "thesis": every weight and bias ~ N(0, 1) (thesis 4.4); "default": PyTorch's scaled uniform
    initialisation, drawn from `rng` so that the seed fixes it."""
    with torch.no_grad():
        for module in gen.modules():
            if isinstance(module, nn.Linear):
                fan_in = module.weight.shape[1]
                for p in (module.weight, module.bias):
                    p.copy_(_init_values(p.shape, fan_in, scheme, rng))


def _init_values(shape, fan_in: int, scheme: str, rng: torch.Generator) -> torch.Tensor:
    if scheme == "thesis":
        return torch.randn(shape, generator=rng, device=rng.device)
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape, generator=rng, device=rng.device) * 2.0 - 1.0) * bound


# ---------------------------------------------------------------------------------------------------
# Stacked networks: parameters are lists of tensors with a leading K dimension.
# ---------------------------------------------------------------------------------------------------


def stacked_linear_params(k: int, fan_in: int, fan_out: int, scheme: str, rng: torch.Generator):
    weight = _init_values((k, fan_in, fan_out), fan_in, scheme, rng)
    bias = _init_values((k, 1, fan_out), fan_in, scheme, rng)
    return [weight, bias]


def _batchnorm_rows(h: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Training-mode BatchNorm over the rows of each network's batch (dimension -2), autograd-friendly."""
    centred = h - h.mean(dim=-2, keepdim=True)
    var = (centred * centred).mean(dim=-2, keepdim=True)
    return centred * torch.rsqrt(var + BN_EPS) * gamma + beta


class CriticStack:
    """K WGAN critics: Linear(d, hidden) -> [BatchNorm] -> LeakyReLU(0.2) -> Linear(hidden, 1).

    `params` is [w1 [K,d,H], b1 [K,1,H], (gamma, beta [K,1,H]), w2 [K,H,1], b2 [K,1,1]]. Every method that
    takes `params` also accepts a slice of the stack (e.g. `[p[k:k + 1] for p in params]`: one critic).
    """

    def __init__(
        self,
        k: int,
        in_width: int,
        hidden: int,
        batchnorm: bool,
        scheme: str,
        rng: torch.Generator,
        device: torch.device | str = "cpu",
    ):
        self.batchnorm = batchnorm
        params = stacked_linear_params(k, in_width, hidden, scheme, rng)
        if batchnorm:
            params += [torch.ones(k, 1, hidden, device=rng.device), torch.zeros(k, 1, hidden, device=rng.device)]
        params += stacked_linear_params(k, hidden, 1, scheme, rng)
        self.params = [p.to(device) for p in params]

    @classmethod
    def from_params(cls, params: list[torch.Tensor], batchnorm: bool) -> CriticStack:
        stack = cls.__new__(cls)
        stack.batchnorm = batchnorm
        stack.params = list(params)
        return stack

    @property
    def k(self) -> int:
        return self.params[0].shape[0]

    @staticmethod
    def trainable(params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The parameters that receive gradients: all but the output bias (see the module notes)."""
        return params[:-1]

    def forward(self, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """x: [K, B, d] with params stacked over K, or [B, d] with params of one critic. Returns [.., B]."""
        if self.batchnorm:
            w1, b1, gamma, beta, w2, b2 = params
        else:
            w1, b1, w2, b2 = params
        h = torch.baddbmm(b1, x, w1) if x.dim() == 3 else torch.addmm(b1, x, w1)
        if self.batchnorm:
            h = _batchnorm_rows(h, gamma, beta)
        h = F.leaky_relu(h, LEAKY_SLOPE)
        out = torch.baddbmm(b2, h, w2) if x.dim() == 3 else torch.addmm(b2, h, w2)
        return out.squeeze(-1)

    # -- gradients ----------------------------------------------------------------------------------
    def loss_grads(
        self,
        params: list[torch.Tensor],
        real: torch.Tensor,
        fake: torch.Tensor,
        alpha: torch.Tensor,
        gp_lambda: float,
        wasserstein: bool = False,
    ):
        """Gradients of the WGAN-GP critic loss mean D(fake) - mean D(real) + lambda * mean (||grad D(x_hat)|| - 1)^2
        (x_hat = alpha * real + (1 - alpha) * fake) per critic, for `trainable(params)`.

        real, fake: [K, B, d]; alpha: [K, B, 1]. Returns (grads, w) where w is the per-critic estimate
        mean D(real) - mean D(fake) before the update ([K]) when `wasserstein`, else None.
        """
        if self.batchnorm:
            return self._loss_grads_autograd(params, real, fake, alpha, gp_lambda, wasserstein)
        x_rf = torch.cat([real, fake], 1)
        return self.loss_grads_rows(params, x_rf, self.weighted_rows(x_rf), alpha, gp_lambda, wasserstein)

    @staticmethod
    def weighted_rows(x_rf: torch.Tensor) -> torch.Tensor:
        """e * x for rows x_rf = [real; fake] (shape [..., 2B, d]), e being each row's weight in the loss
        mean D(fake) - mean D(real): -1/B for real rows, +1/B for fake rows."""
        *lead, rows, width = x_rf.shape
        batch = rows // 2
        key = ("signs", batch, x_rf.dtype, str(x_rf.device))
        e = _CONSTANTS.get(key)
        if e is None:
            e = torch.tensor([[-1.0 / batch], [1.0 / batch]], dtype=x_rf.dtype, device=x_rf.device)
            _CONSTANTS[key] = e
        # One weight per half ([real; fake]) broadcast over its B * d contiguous values: the same
        # products as a weight per row, without a broadcast over rows of only d values (slow on CPU).
        return (x_rf.reshape(*lead, 2, batch * width) * e).view(x_rf.shape)

    def loss_grads_rows(
        self,
        params: list[torch.Tensor],
        x_rf: torch.Tensor,
        xe: torch.Tensor,
        alpha: torch.Tensor,
        gp_lambda: float,
        wasserstein: bool = False,
        ws: Workspace | None = None,
    ):
        """`loss_grads` (critics without BatchNorm) from x_rf = [real; fake] rows [K, 2B, d] and
        xe = `weighted_rows(x_rf)`, which callers can prepare for many steps at once.
        The gradients live in `ws` buffers when one is given (valid until its next use)."""
        ws = ws or Workspace()
        w1, b1, w2, _ = params
        k, rows, width = x_rf.shape
        batch = rows // 2
        hidden = w1.shape[-1]
        h_rf = torch.baddbmm(b1, x_rf, w1, out=ws("c.h_rf", (k, rows, hidden), x_rf))
        # The first layer is affine, so its value at x_hat = alpha real + (1 - alpha) fake is the same
        # interpolation of its values at real and fake: no product with w1 for the x_hat rows.
        h_x = torch.lerp(h_rf[:, batch:], h_rf[:, :batch], alpha, out=ws("c.h_x", (k, batch, hidden), x_rf))
        w2_rows = w2.transpose(1, 2)
        # S * w2 per row (S = LeakyReLU'(h)) in one op: d D / d h for real/fake rows, u for x_hat rows.
        sv = _leaky_grad(w2_rows.expand_as(h_rf), h_rf, ws("c.sv", h_rf.shape, x_rf))
        u = _leaky_grad(w2_rows.expand_as(h_x), h_x, ws("c.u", h_x.shape, x_rf))
        g = torch.bmm(u, w1.transpose(1, 2))  # grad of D at x_hat: [K, B, d]
        # d GP / d g = c (g - g / ||g||), c = 2 lambda / B  (zero at g = 0, as autograd's norm backward)
        norm = torch.linalg.vector_norm(g, dim=-1, keepdim=True).clamp_min_(1e-30)
        c = 2.0 * gp_lambda / batch
        q = torch.addcdiv(g * c, g, norm, value=-c)
        # dw1: (e x) outer (S w2) summed over the real/fake rows, plus q outer u over the x_hat rows.
        dw1 = torch.bmm(q.transpose(1, 2), u, out=ws("c.dw1", (k, width, hidden), x_rf))
        dw1.baddbmm_(xe.transpose(1, 2), sv)
        # db1 = sum of e S w2, as separate sums over the fake and the real rows like autograd: its true value
        # is often exactly zero (same active units in both batches), where Adam turns any difference in
        # rounding into a visible update, so the summation order is kept the reference's.
        sums = sv.view(k, 2, batch, hidden).sum(2)  # [K, 2, H]: real rows, fake rows
        db1 = torch.sub(sums[:, 1:], sums[:, :1]).mul_(1.0 / batch)
        a = torch._C._nn.leaky_relu(h_rf, LEAKY_SLOPE, out=ws("c.a", h_rf.shape, x_rf))
        sums = a.view(k, 2, batch, hidden).sum(2)
        a_diff = torch.sub(sums[:, 1], sums[:, 0]).mul_(1.0 / batch)  # sum of e a: [K, H]
        qv = torch.bmm(q, w1, out=ws("c.qv", h_x.shape, x_rf))  # d GP / d u: [K, B, H]
        dw2 = _leaky_grad(qv, h_x, qv).sum(1).add_(a_diff).unsqueeze_(-1)
        w = -(a_diff * w2.squeeze(-1)).sum(-1) if wasserstein else None
        return [dw1, db1, dw2], w

    def _loss_grads_autograd(self, params, real, fake, alpha, gp_lambda, wasserstein):
        leaves = [p.detach().requires_grad_(True) for p in params]

        def forward(x):
            return self.forward(leaves, x)

        with torch.enable_grad():
            d_real, d_fake = forward(real).mean(1), forward(fake).mean(1)
            x_hat = (alpha * real + (1.0 - alpha) * fake).requires_grad_(True)
            (grad,) = torch.autograd.grad(forward(x_hat).sum(), x_hat, create_graph=True)
            gp = ((grad.norm(dim=-1) - 1.0) ** 2).mean(dim=-1)
            loss = (d_fake - d_real + gp_lambda * gp).sum()
            grads = torch.autograd.grad(loss, self.trainable(leaves))
        return list(grads), (d_real - d_fake).detach() if wasserstein else None

    def input_grad(self, params: list[torch.Tensor], x: torch.Tensor, ws: Workspace | None = None) -> torch.Tensor:
        """d (sum of D(x) over rows) / dx for x [K, B, d]: each row's gradient of its own score (with
        BatchNorm, of the batch's summed score)."""
        if self.batchnorm:
            leaves = [p.detach() for p in params]
            with torch.enable_grad():
                rows = x.detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(self.forward(leaves, rows).sum(), rows)
            return grad
        ws = ws or Workspace()
        w1, b1, w2, _ = params
        h = torch.baddbmm(b1, x, w1, out=ws("c.h_in", x.shape[:2] + w1.shape[-1:], x))
        sv = _leaky_grad(w2.transpose(1, 2).expand_as(h), h, h)
        return torch.bmm(sv, w1.transpose(1, 2))

    def state_dict(self) -> dict:
        return {"batchnorm": self.batchnorm, "params": [p.detach().cpu() for p in self.params]}

    def load_state_dict(self, state: dict) -> None:
        self.batchnorm = state["batchnorm"]
        device = self.params[0].device
        self.params = [p.to(device) for p in state["params"]]


class GeneratorStack:
    """K throwaway generators of the released generator's architecture (pretraining only).

    `params` per hidden layer: [w [K,in,out], b [K,1,out] (inert, see the module notes), gamma, beta
    [K,1,out]]; then the output layer [w, b].
    """

    def __init__(
        self,
        k: int,
        z_dim: int,
        hidden: tuple[int, ...],
        out_width: int,
        head: str,
        groups: Sequence[HeadGroup],
        scheme: str,
        rng: torch.Generator,
        device: torch.device | str = "cpu",
        condition: tuple[int, float] | None = None,
        matmul_dtype: torch.dtype | None = None,
        native_batchnorm: bool = False,
    ):
        self.head, self.groups = head, [tuple(g) for g in groups]
        # None: float32 products. torch.bfloat16: the products of `forward_train` and `backward` round
        # their operands and results to bfloat16 and accumulate in float32 (mixed precision, as autocast
        # does); everything else (BatchNorm, head, gradients' other terms, Adam) stays float32.
        self.matmul_dtype = matmul_dtype
        # With bfloat16 products: BatchNorm + ReLU by the C kernel (dpsynth.models.native.kernels), one pass
        # instead of six mixed-precision tensor passes; the same formulas, float32 rounding apart.
        self.native_batchnorm = native_batchnorm and matmul_dtype == torch.bfloat16
        self.z_dim = z_dim
        self.layout = LatentLayout(z_dim, condition, head_noise_width(head, out_width))
        params, width = [], self.layout.body_width
        for h in hidden:
            params += stacked_linear_params(k, width, h, scheme, rng)
            params += [torch.ones(k, 1, h, device=rng.device), torch.zeros(k, 1, h, device=rng.device)]
            width = h
        params += stacked_linear_params(k, width, out_width, scheme, rng)
        self.params = [p.to(device) for p in params]
        self.n_hidden = len(hidden)

    def trainable(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every parameter but the inert pre-BatchNorm biases, in the order `backward` returns grads."""
        keep = []
        for i in range(self.n_hidden):
            w, _, gamma, beta = params[4 * i : 4 * i + 4]
            keep += [w, gamma, beta]
        return keep + list(params[-2:])

    def forward(self, params: list[torch.Tensor], z: torch.Tensor, chunks: int = 1) -> torch.Tensor:
        """Autograd-friendly reference. z: [K, chunks * B, z_dim]; BatchNorm statistics are taken over
        each chunk of B rows, so one call produces `chunks` independent generator batches per network."""
        k, rows, _ = z.shape
        h = self.layout.body(z)
        for i in range(self.n_hidden):
            w, b, gamma, beta = params[4 * i : 4 * i + 4]
            h = torch.baddbmm(b, h, w)
            h = _batchnorm_rows(h.view(k, chunks, rows // chunks, -1), gamma.unsqueeze(1), beta.unsqueeze(1))
            h = F.relu(h).view(k, rows, -1)
        w, b = params[-2:]
        out = apply_head(torch.baddbmm(b, h, w), self.head, self.groups, self.layout.noise(z))
        return self.layout.with_label(out, z)

    @torch.no_grad()
    def forward_train(self, params: list[torch.Tensor], z: torch.Tensor, chunks: int, ws: Workspace | None = None):
        """Forward of `chunks` batches per network (as `forward`), keeping what `backward` needs for the
        LAST chunk only. Returns (out [K, chunks * B, width], saved); both live in `ws` buffers if given."""
        ws = ws or Workspace()
        k, rows, _ = z.shape
        batch = rows // chunks
        h = self.layout.body(z)
        h_p = self._operand(h, ws, "g.in0")
        # operands: each layer's (input rows of the last chunk, weight) in the product dtype, for backward
        inputs, xhats, scales, operands = [h[:, rows - batch :]], [], [], []
        for i in range(self.n_hidden):
            w, _, gamma, beta = params[4 * i : 4 * i + 4]
            width = w.shape[-1]
            w_p = self._operand(w, ws, f"g.w{i}")
            operands.append((h_p[:, rows - batch :], w_p))
            if self.native_batchnorm:
                y_low = torch.bmm(h_p, w_p, out=ws(f"g.y{i}.low", (k, rows, width), z, self.matmul_dtype))
                h_p = ws(f"g.in{i + 1}", y_low.shape, z, self.matmul_dtype)
                last = ws(f"g.last{i}", (k, batch, width), z)
                xhats.append(ws(f"g.xhat{i}", (k, batch, width), z))
                scales.append(ws(f"g.scale{i}", (k, 1, width), z))
                batchnorm_relu_bf16(
                    y_low.view(k, chunks, batch, width),
                    gamma,
                    beta,
                    BN_EPS,
                    h_p.view(k, chunks, batch, width),
                    last,
                    xhats[-1],
                    scales[-1],
                )
                inputs.append(last)
                continue
            y = ws(f"g.y{i}", (k, rows, width), z)
            yv = y.view(k, chunks, batch, width)
            if self.matmul_dtype is None:
                torch.bmm(h_p, w_p, out=y)
                yv.sub_(yv.mean(2, keepdim=True))
            else:  # centred while widened: one pass over the low-precision product
                y_low = torch.bmm(h_p, w_p, out=ws(f"g.y{i}.low", y.shape, z, self.matmul_dtype)).view(yv.shape)
                torch.sub(y_low, y_low.mean(2, keepdim=True, dtype=y.dtype), out=yv)
            sq = torch.mul(yv, yv, out=ws(f"g.sq{i}", yv.shape, z))
            rstd = sq.sum(2, keepdim=True).mul_(1.0 / batch).add_(BN_EPS).rsqrt_()
            xhats.append(torch.mul(yv[:, -1], rstd[:, -1], out=ws(f"g.xhat{i}", (k, batch, width), z)))
            scale = rstd.mul_(gamma.unsqueeze(1))
            scales.append(scale[:, -1])
            if self.matmul_dtype is None:
                torch.addcmul(beta.unsqueeze(1), yv, scale, out=yv).relu_()
                h_p = y
            else:  # written straight into the narrower operand of the next product; in float32 only
                # for the last chunk, which backward reads
                h_p = ws(f"g.in{i + 1}", y.shape, z, self.matmul_dtype)
                torch.addcmul(beta.unsqueeze(1), yv, scale, out=h_p.view(yv.shape)).relu_()
                torch.addcmul(beta, yv[:, -1], scale[:, -1], out=yv[:, -1]).relu_()
            inputs.append(y[:, rows - batch :])
        w, b = params[-2:]
        w_p = self._operand(w, ws, "g.w_out")
        operands.append((h_p[:, rows - batch :], w_p))
        logits = ws("g.out", (k, rows, w.shape[-1]), z)
        if self.matmul_dtype is None:
            torch.baddbmm(b, h_p, w_p, out=logits)
        else:
            self._matmul(h_p, w_p, logits, ws).add_(b)
        if self.head == "tanh" or (self.head == "typed" and not one_hot_groups(self.groups)):
            out = logits.tanh_()
        else:
            out = apply_head(logits, self.head, self.groups, self.layout.noise(z))
        self.layout.impose_label_(out, z)
        return out, (inputs, xhats, scales, out[:, rows - batch :], operands)

    def _operand(self, x: torch.Tensor, ws: Workspace, name: str) -> torch.Tensor:
        """x as a product operand: itself, or its copy in `matmul_dtype`."""
        if self.matmul_dtype is None:
            return x
        return ws(name, x.shape, x, self.matmul_dtype).copy_(x)

    @staticmethod
    def _matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, ws: Workspace) -> torch.Tensor:
        """a @ b (batched) written into `out` (float32). Operands in a lower precision multiply there,
        accumulating in float32, and their product is rounded to it before widening into `out`."""
        if a.dtype == out.dtype:
            return torch.bmm(a, b, out=out)
        return out.copy_(torch.bmm(a, b, out=ws(f"product{tuple(out.shape)}", out.shape, out, a.dtype)))

    @torch.no_grad()
    def backward(
        self, params: list[torch.Tensor], saved, dout: torch.Tensor, ws: Workspace | None = None
    ) -> list[torch.Tensor]:
        """Gradients for `trainable(params)` of sum(out_last_chunk * dout)."""
        ws = ws or Workspace()
        inputs, xhats, scales, out, operands = saved
        batch = out.shape[1]
        do = head_backward(out, dout, self.head, self.groups)
        do_p = self._operand(do, ws, "g.do")
        in_p, w_p = operands[-1]
        tail = [self._matmul(in_p.transpose(1, 2), do_p, ws("g.dw_out", w_p.shape, do), ws), do.sum(1, keepdim=True)]
        dx = self._matmul(do_p, w_p.transpose(1, 2), ws(f"g.dx{self.n_hidden - 1}", inputs[-1].shape, do), ws)
        grads: list[torch.Tensor] = []
        for i in reversed(range(self.n_hidden)):
            # ReLU' (its output is the next layer's input), in place
            dz = _threshold_backward_(dx, inputs[i + 1])
            dbeta = dz.sum(1, keepdim=True)
            dgamma = torch.mul(dz, xhats[i], out=ws(f"g.tmp{i}", dz.shape, dz)).sum(1, keepdim=True)
            # dy = gamma * rstd * (dz - mean(dz) - xhat * mean(dz * xhat)), written over dz
            dy = dz.sub_(dbeta, alpha=1.0 / batch).addcmul_(xhats[i], dgamma, value=-1.0 / batch).mul_(scales[i])
            dy_p = self._operand(dy, ws, f"g.dy{i}")
            in_p, w_p = operands[i]
            dw = self._matmul(in_p.transpose(1, 2), dy_p, ws(f"g.dw{i}", w_p.shape, do), ws)
            if i > 0:
                dx = self._matmul(dy_p, w_p.transpose(1, 2), ws(f"g.dx{i - 1}", inputs[i].shape, do), ws)
            grads = [dw, dgamma, dbeta] + grads
        return grads + tail


class Workspace:
    """Output buffers reused from one call to the next (one per name and shape). A training loop that
    allocates its large temporaries afresh at every step pays page faults on each of them: with a
    workspace per loop they are allocated once. Tensors taken from it are valid until its next use."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, shape, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A buffer of `shape` on `like`'s device, of `like`'s dtype unless `dtype` is given."""
        dtype = dtype or like.dtype
        buf = self._buffers.get(name)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != dtype or buf.device != like.device:
            buf = torch.empty(tuple(shape), dtype=dtype, device=like.device)
            self._buffers[name] = buf
        return buf


def _threshold_backward_(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """grad * ReLU'(z) in place, from the ReLU's output."""
    return torch.ops.aten.threshold_backward.grad_input(grad, out, 0.0, grad_input=grad)


def _leaky_grad(grad: torch.Tensor, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """grad * LeakyReLU'(h), written into `out` (which may be `grad`)."""
    return torch.ops.aten.leaky_relu_backward.grad_input(grad, h, LEAKY_SLOPE, False, grad_input=out)


class StackedAdam:
    """Adam over stacked parameters with a step count per network, so that updating only network k
    is exactly the update an independent Adam of network k would make (PyTorch's fused Adam kernel,
    which computes what `torch.optim.Adam` computes)."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas: tuple[float, float], eps: float = 1e-8):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = np.zeros(params[0].shape[0], dtype=np.int64)
        self._step_tensors: dict[int, torch.Tensor] = {}  # read-only step counts for the fused kernel

    def step_all(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Update every network (they all step together, so they share one step count)."""
        self.steps += 1
        self._update(params, grads, self.exp_avg, self.exp_avg_sq, int(self.steps[0]))

    def moments(self, index: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Views of network `index`'s Adam moments (slices [index:index + 1]), for `step_one`."""
        sl = slice(index, index + 1)
        return [m[sl] for m in self.exp_avg], [v[sl] for v in self.exp_avg_sq]

    def step_one(
        self,
        index: int,
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        moments: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    ) -> None:
        """Update network `index`: `params` and `grads` are its slices [index:index + 1] of the stack
        (views: the stack is updated in place); `moments` may be passed from `moments(index)`."""
        self.steps[index] += 1
        exp_avg, exp_avg_sq = moments if moments is not None else self.moments(index)
        self._update(params, grads, exp_avg, exp_avg_sq, int(self.steps[index]))

    def _update(self, params, grads, exp_avg, exp_avg_sq, t: int) -> None:
        step = self._step_tensors.get(t)
        if step is None or step.device != params[0].device:
            step = self._step_tensors[t] = torch.tensor(float(t), device=params[0].device)
        torch._fused_adam_(
            params,
            grads,
            exp_avg,
            exp_avg_sq,
            [],
            [step] * len(params),
            lr=self.lr,
            beta1=self.betas[0],
            beta2=self.betas[1],
            weight_decay=0.0,
            eps=self.eps,
            amsgrad=False,
            maximize=False,
        )

    def state_dict(self) -> dict:
        return {
            "exp_avg": [t.cpu() for t in self.exp_avg],
            "exp_avg_sq": [t.cpu() for t in self.exp_avg_sq],
            "steps": torch.from_numpy(self.steps.copy()),
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
        }

    def load_state_dict(self, state: dict, device: torch.device | str = "cpu") -> None:
        self.exp_avg = [t.to(device) for t in state["exp_avg"]]
        self.exp_avg_sq = [t.to(device) for t in state["exp_avg_sq"]]
        self.steps = np.asarray(torch.as_tensor(state["steps"]).cpu(), dtype=np.int64).copy()
