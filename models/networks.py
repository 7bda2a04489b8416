"""Networks of GS-WGAN for tables (thesis 4.4; REFERENCE.md section 1).

`Generator` is the released model: z -> fully connected hidden layers with BatchNorm and ReLU -> an output
of the encoded width. Critics and pretraining's throwaway generators are kept as *stacks*: one tensor
per layer with a leading dimension of K, so that K independent networks train together through batched
matrix products instead of a Python loop over networks.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

BN_EPS = 1e-5


class OutputHead(nn.Module):
    """Tanh for every encoded column (thesis), or Tanh for single columns and a softmax mapped to
    [-1, 1] over each one-hot group ("typed")."""

    def __init__(self, kind: str, groups: list[tuple[int, int]]):
        super().__init__()
        self.kind = kind
        self.groups = [g for g in groups if g[1] - g[0] > 1]

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return apply_head(logits, self.kind, self.groups)


def apply_head(logits: torch.Tensor, kind: str, groups: list[tuple[int, int]]) -> torch.Tensor:
    out = torch.tanh(logits)
    if kind == "typed" and groups:
        parts, last = [], 0
        for start, stop in groups:
            parts.append(out[..., last:start])
            parts.append(2.0 * torch.softmax(logits[..., start:stop], dim=-1) - 1.0)
            last = stop
        parts.append(out[..., last:])
        out = torch.cat(parts, dim=-1)
    return out


class Generator(nn.Module):
    def __init__(self, z_dim: int, hidden: tuple[int, ...], out_width: int, head: str = "tanh",
                 groups: list[tuple[int, int]] | None = None):
        super().__init__()
        self.z_dim = z_dim
        layers, width = [], z_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.BatchNorm1d(h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, out_width))
        self.body = nn.Sequential(*layers)
        self.head = OutputHead(head, groups or [])

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(z))


def init_generator_(gen: Generator, scheme: str, rng: torch.Generator) -> None:
    """"thesis": every weight and bias ~ N(0, 1) (thesis 4.4); "default": PyTorch's scaled uniform
    initialisation, drawn from `rng` so that the seed fixes it."""
    with torch.no_grad():
        for module in gen.modules():
            if isinstance(module, nn.Linear):
                fan_in = module.weight.shape[1]
                for p in (module.weight, module.bias):
                    p.copy_(_init_values(p.shape, fan_in, scheme, rng))


def _init_values(shape, fan_in: int, scheme: str, rng: torch.Generator) -> torch.Tensor:
    if scheme == "thesis":
        return torch.randn(shape, generator=rng)
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape, generator=rng) * 2.0 - 1.0) * bound


# ---------------------------------------------------------------------------------------------------
# Stacked networks: parameters are lists of tensors with a leading K dimension.
# ---------------------------------------------------------------------------------------------------

def stacked_linear_params(k: int, fan_in: int, fan_out: int, scheme: str, rng: torch.Generator):
    weight = _init_values((k, fan_in, fan_out), fan_in, scheme, rng)
    bias = _init_values((k, 1, fan_out), fan_in, scheme, rng)
    return [weight, bias]


def _batchnorm_rows(h: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Training-mode BatchNorm over the rows of each network's batch (dimension -2)."""
    mean = h.mean(dim=-2, keepdim=True)
    var = h.var(dim=-2, unbiased=False, keepdim=True)
    return (h - mean) * torch.rsqrt(var + BN_EPS) * gamma + beta


class CriticStack:
    """K WGAN critics: Linear(d, hidden) -> [BatchNorm] -> LeakyReLU(0.2) -> Linear(hidden, 1)."""

    def __init__(self, k: int, in_width: int, hidden: int, batchnorm: bool, scheme: str, rng: torch.Generator,
                 device: torch.device | str = "cpu"):
        self.batchnorm = batchnorm
        params = stacked_linear_params(k, in_width, hidden, scheme, rng)
        if batchnorm:
            params += [torch.ones(k, 1, hidden), torch.zeros(k, 1, hidden)]
        params += stacked_linear_params(k, hidden, 1, scheme, rng)
        self.params = [p.to(device) for p in params]

    @property
    def k(self) -> int:
        return self.params[0].shape[0]

    def forward(self, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """x: [K, B, d] with params stacked over K, or [B, d] with params of one critic. Returns [.., B]."""
        if self.batchnorm:
            w1, b1, gamma, beta, w2, b2 = params
        else:
            w1, b1, w2, b2 = params
        h = torch.baddbmm(b1, x, w1) if x.dim() == 3 else torch.addmm(b1, x, w1)
        if self.batchnorm:
            h = _batchnorm_rows(h, gamma, beta)
        h = F.leaky_relu(h, 0.2)
        out = torch.baddbmm(b2, h, w2) if x.dim() == 3 else torch.addmm(b2, h, w2)
        return out.squeeze(-1)

    def state_dict(self) -> dict:
        return {"batchnorm": self.batchnorm, "params": [p.detach().cpu() for p in self.params]}

    def load_state_dict(self, state: dict) -> None:
        self.batchnorm = state["batchnorm"]
        device = self.params[0].device
        self.params = [p.to(device) for p in state["params"]]


class GeneratorStack:
    """K throwaway generators of the released generator's architecture (pretraining only)."""

    def __init__(self, k: int, z_dim: int, hidden: tuple[int, ...], out_width: int, head: str,
                 groups: list[tuple[int, int]], scheme: str, rng: torch.Generator,
                 device: torch.device | str = "cpu"):
        self.head, self.groups = head, [g for g in groups if g[1] - g[0] > 1]
        self.z_dim = z_dim
        params, width = [], z_dim
        for h in hidden:
            params += stacked_linear_params(k, width, h, scheme, rng)
            params += [torch.ones(k, 1, h), torch.zeros(k, 1, h)]
            width = h
        params += stacked_linear_params(k, width, out_width, scheme, rng)
        self.params = [p.to(device) for p in params]
        self.n_hidden = len(hidden)

    def forward(self, params: list[torch.Tensor], z: torch.Tensor, chunks: int = 1) -> torch.Tensor:
        """z: [K, chunks * B, z_dim]. BatchNorm statistics are taken over each chunk of B rows, so one
        call produces `chunks` independent generator batches per network (the r critic steps' fakes)."""
        k, rows, _ = z.shape
        h = z
        for i in range(self.n_hidden):
            w, b, gamma, beta = params[4 * i: 4 * i + 4]
            h = torch.baddbmm(b, h, w)
            h = _batchnorm_rows(h.view(k, chunks, rows // chunks, -1), gamma.unsqueeze(1), beta.unsqueeze(1))
            h = F.relu(h).view(k, rows, -1)
        w, b = params[-2:]
        return apply_head(torch.baddbmm(b, h, w), self.head, self.groups)


class StackedAdam:
    """Adam over stacked parameters with a step count per network, so that updating only network k
    is exactly the update an independent Adam of network k would make."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas: tuple[float, float], eps: float = 1e-8):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = torch.zeros(params[0].shape[0], dtype=torch.long)

    def step_all(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Update every network (they all step together, so they share one step count)."""
        self.steps += 1
        t = int(self.steps[0])
        self._update(params, grads, self.exp_avg, self.exp_avg_sq, t)

    def step_one(self, index: int, params: list[torch.Tensor], grads: list[torch.Tensor],
                 exp_avg: list[torch.Tensor], exp_avg_sq: list[torch.Tensor]) -> None:
        """Update the extracted parameters of network `index` with its extracted moments."""
        self.steps[index] += 1
        self._update(params, grads, exp_avg, exp_avg_sq, int(self.steps[index]))

    def _update(self, params, grads, exp_avg, exp_avg_sq, t: int) -> None:
        beta1, beta2 = self.betas
        bias1 = 1.0 - beta1 ** t
        bias2 = 1.0 - beta2 ** t
        step_size = self.lr / bias1
        with torch.no_grad():
            torch._foreach_lerp_(exp_avg, grads, 1.0 - beta1)
            torch._foreach_mul_(exp_avg_sq, beta2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, 1.0 - beta2)
            denom = torch._foreach_sqrt(exp_avg_sq)
            torch._foreach_div_(denom, math.sqrt(bias2))
            torch._foreach_add_(denom, self.eps)
            torch._foreach_addcdiv_(params, exp_avg, denom, -step_size)

    def state_dict(self) -> dict:
        return {"exp_avg": [t.cpu() for t in self.exp_avg], "exp_avg_sq": [t.cpu() for t in self.exp_avg_sq],
                "steps": self.steps.clone(), "lr": self.lr, "betas": self.betas, "eps": self.eps}

    def load_state_dict(self, state: dict, device: torch.device | str = "cpu") -> None:
        self.exp_avg = [t.to(device) for t in state["exp_avg"]]
        self.exp_avg_sq = [t.to(device) for t in state["exp_avg_sq"]]
        self.steps = state["steps"].clone()
