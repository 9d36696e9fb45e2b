"""Mixed precision: autocast for bf16/fp16 compute, fp32 master weights, and dynamic loss
scaling (``torch.amp.GradScaler``) for fp16. With DDP every rank sees the same reduced
gradients, so the scaler's overflow decision is the same on every rank."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from dtrain_cli.config.schema import PrecisionConfig
from dtrain_cli.plan.plan import PrecisionPlan


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

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
        else:
            with torch.autocast(self.device_type, dtype=self.dtype):
                yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.nn.Parameter],
        max_norm: float,
        want_norm: bool,
    ) -> torch.Tensor | None:
        """Unscale, clip (global norm), step, update the scale. Returns the grad norm tensor
        when clipping or asked for (no host sync here)."""
        if self.scaler:
            self.scaler.unscale_(optimizer)
        norm = None
        if max_norm > 0 or want_norm:
            norm = torch.nn.utils.clip_grad_norm_(
                params, max_norm if max_norm > 0 else float("inf"), foreach=True
            )
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        return norm
