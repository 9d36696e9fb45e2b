"""Mixed precision: autocast for bf16/fp16 compute, fp32 master weights, and dynamic loss
scaling (``torch.amp.GradScaler``) for fp16. The overflow decision is made the same on
every rank: with tensor or pipeline parallel each rank sees other gradients, so the
``found_inf`` flags are all-reduced (MAX) before any rank steps or skips."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dtrain_cli.config.schema import PrecisionConfig
from dtrain_cli.plan.plan import PrecisionPlan
from dtrain_cli.runtime.state.optim import Optimizers, grad_norm, group_by_mesh


class Precision:
    def __init__(self, plan: PrecisionPlan, cfg: PrecisionConfig, device: torch.device) -> None:
        self.device_type = device.type
        self.dtype = getattr(torch, plan.autocast_dtype) if plan.autocast_dtype else None
        self.scaler = (
            torch.amp.GradScaler(
                device.type, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval
            )
            if plan.loss_scaling
            else None
        )
        if self.scaler:  # its scale made now: a pipeline stage without the loss never
            self.scaler.scale(torch.ones((), device=device))  # scales one, yet unscales

    def autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast for bf16/fp16; a no-op context for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler else loss

    def unscale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """A loss that went through :meth:`scale`, back at its true value (no host sync)."""
        return loss / self.scaler._scale if self.scaler else loss  # type: ignore[operator]

    def backward(self, loss: torch.Tensor) -> None:
        self.scale(loss).backward()

    def step(
        self,
        optimizers: Optimizers,
        max_norm: float,
        want_norm: bool,
        pp_group: Any | None = None,
        overflow_group: Any | None = None,
        guard: Callable[[torch.Tensor | None], bool] | None = None,
    ) -> torch.Tensor | None:
        """Unscale, clip to the global norm, step (or skip on overflow), update the scale.
        Returns the norm tensor when clipping or asked for (no host sync here). ``guard``
        (the numerics policy) sees the norm before the step and may drop it."""
        if self.scaler:
            for opt in optimizers.optimizers:
                self.scaler.unscale_(opt)
            if overflow_group is not None:
                for opt in optimizers.optimizers:
                    for flag in self.scaler._found_inf_per_device(opt).values():
                        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=overflow_group)
        norm = None
        if max_norm > 0 or want_norm:
            params = optimizers.params
            if pp_group is None and optimizers.plain_params:  # no shards, no stages
                limit = max_norm if max_norm > 0 else float("inf")
                norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=True)
            else:
                norm = grad_norm(params, pp_group)
                if max_norm > 0:
                    clip_to_norm(params, max_norm, norm)
        if guard is not None and not guard(norm):
            if self.scaler:
                self.scaler.update()  # resets the per-step unscale state
            return norm
        for opt in optimizers.optimizers:
            if self.scaler:
                self.scaler.step(opt)
            else:
                opt.step()
        if self.scaler:
            self.scaler.update()
        return norm


def clip_to_norm(params: list[torch.nn.Parameter], max_norm: float, norm: torch.Tensor) -> None:
    """Scale gradients by min(1, max_norm / norm), one foreach call per mesh group."""
    with_grad = [p for p in params if p.grad is not None]
    by_grad = {id(p.grad): p for p in with_grad}
    for grads in group_by_mesh([p.grad for p in with_grad]).values():
        group = [by_grad[id(g)] for g in grads]
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
