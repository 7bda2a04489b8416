"""The released generator's optimiser step: exactly `torch.optim.Adam(fused=True).step()`, called directly.
A GS-WGAN training step updates a few small tensors, so the optimiser's per-call Python overhead is a
visible share of it."""

from __future__ import annotations

from typing import cast

import torch


class FusedAdamStep:
    """Calling it is `optimizer.step()` for `params`, the optimiser's only parameter group (fused Adam)."""

    def __init__(self, optimizer: torch.optim.Adam, params: list[torch.Tensor]) -> None:
        self.optimizer, self.params = optimizer, params
        self.sync()

    def sync(self) -> None:
        """The optimiser's state, created as `torch.optim.Adam(fused=True)` creates it on its first step, and
        lists of it for the step (again after the optimiser loads a checkpoint's state)."""
        for p in self.params:
            state = self.optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        states = [self.optimizer.state[p] for p in self.params]
        self._state = tuple([s[key] for s in states] for key in ("exp_avg", "exp_avg_sq", "step"))

    def __call__(self) -> None:
        group = self.optimizer.param_groups[0]
        exp_avg, exp_avg_sq, steps = self._state
        torch._foreach_add_(steps, 1)
        grads = cast("list[torch.Tensor]", [p.grad for p in self.params])  # every one set by the backward pass
        torch._fused_adam_(
            self.params,
            grads,
            exp_avg,
            exp_avg_sq,
            [],
            steps,
            lr=group["lr"],
            beta1=group["betas"][0],
            beta2=group["betas"][1],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
        )
