"""How one optimizer step's forward/backward runs on this rank.

- :class:`LocalStep`: the whole model (or its tensor-parallel shard) on this rank;
  gradient accumulation over micro-batches, the dp all-reduce skipped on all but the last.
- :class:`PipelineStep`: this rank's pipeline stage(s), driven by a
  ``torch.distributed.pipelining`` schedule; the schedule splits a call's batch into
  micro-batches, the loss function scales each by 1/(micro-batches per step), and calls
  accumulate on top.

Both return the loss this rank *reports* (a device tensor, no host sync): the mean over
the step's micro-batches on ranks that see the loss (the last stage), zero elsewhere.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from dtrain_cli.plan.layout import V_SHAPED
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.data import BatchLayout, SampleStream
from dtrain_cli.runtime.model import lm_loss
from dtrain_cli.runtime.parallelize import ParallelModel, gradient_sync
from dtrain_cli.runtime.precision import Precision


class Batches:
    """This rank's micro-batches of the global sample stream (see :mod:`.data`)."""

    def __init__(self, windows: Any, layout: BatchLayout, seed: int, device: torch.device) -> None:
        self.windows = windows
        self.layout = layout
        self.stream = SampleStream(len(windows), seed)
        self.device = device
        self.pin = device.type == "cuda"
        self.wait_s = 0.0
        """Time the training loop spent getting batches (reported per step in the summary)."""

    def micro_batch(self, step: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        start = self.layout.micro_start(step, micro_step)
        idx = self.stream.indices(start, self.layout.micro_batch_size)
        out = self.to_device(*self.windows.pairs(idx))
        self.wait_s += time.perf_counter() - t0
        return out

    def micro_batches(self, step: int, first: int, count: int) -> tuple[torch.Tensor, ...]:
        """Micro-steps ``first .. first+count-1`` concatenated (one pipeline call)."""
        parts = [self.micro_batch(step, k) for k in range(first, first + count)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def to_device(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        pair = (torch.from_numpy(x), torch.from_numpy(y))
        if self.pin:
            return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in pair)
        return pair


class LocalStep:
    def __init__(self, pm: ParallelModel, plan: Plan, precision: Precision) -> None:
        self.model = pm.parts[0]
        self.accum = plan.batch.grad_accum
        self.precision = precision

    def __call__(self, batches: Batches, step: int) -> torch.Tensor:
        if self.accum == 1:  # the common case, without accumulation bookkeeping
            x, y = batches.micro_batch(step, 0)
            with self.precision.autocast():
                loss = lm_loss(self.model(x), y)
            self.precision.backward(loss)
            return loss.detach()
        losses = []
        for k in range(self.accum):
            x, y = batches.micro_batch(step, k)
            with gradient_sync(self.model, enabled=k == self.accum - 1):
                with self.precision.autocast():
                    loss = lm_loss(self.model(x), y) / self.accum
                self.precision.backward(loss)
            losses.append(loss.detach())
        return torch.stack(losses).sum()

    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():
            return lm_loss(self.model(x), y)


class PipelineStep:
    def __init__(self, pm: ParallelModel, plan: Plan, precision: Precision) -> None:
        assert plan.pipeline is not None and pm.schedule is not None
        self.pm = pm
        self.schedule = pm.schedule
        self.m = plan.pipeline.microbatches
        self.calls = plan.pipeline.calls_per_step
        self.v_shaped = plan.pipeline.schedule in V_SHAPED
        self.precision = precision
        self._scale = 1.0 / (self.calls * self.m)

    def loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Called by the schedule on the last stage for each micro-batch, scaled so that
        the step's gradients (all calls accumulated) are those of the mean loss."""
        return self.precision.scale(lm_loss(output, target) * self._scale)

    def _run(self, x: torch.Tensor, y: torch.Tensor, train: bool) -> torch.Tensor | None:
        """One schedule call; the sum of its (scaled) micro-batch losses on the last stage."""
        args: tuple[Any, ...] = (x,) if self.pm.has_first_stage else ()
        last = self.pm.has_last_stage
        losses: list[torch.Tensor] | None = [] if last else None
        kwargs = {"target": y, "losses": losses} if last else {}
        with self.precision.autocast():
            (self.schedule.step if train else self.schedule.eval)(*args, **kwargs)
        if not losses:
            return None
        total = torch.stack([loss.detach() for loss in losses]).sum()
        return self.precision.unscale_loss(total)

    def __call__(self, batches: Batches, step: int) -> torch.Tensor:
        self._scale = 1.0 / (self.calls * self.m)
        total = torch.zeros((), device=batches.device)
        for c in range(self.calls):
            x, y = batches.micro_batches(step, c * self.m, self.m)
            loss = self._run(x, y, train=True)
            if loss is not None:
                total += loss
        return total

    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean loss of a batch of ``m`` micro-batches (zero on ranks without the loss).
        torch's forward-only ``eval`` does not run V-shaped schedules (zbv, dualpipev):
        those validate through a training pass whose gradients are then dropped."""
        self._scale = 1.0 / self.m
        if self.v_shaped:
            with torch.enable_grad():
                loss = self._run(x, y, train=True)
            for p in self.pm.parameters():
                p.grad = None
        else:
            loss = self._run(x, y, train=False)
        return torch.zeros((), device=x.device) if loss is None else loss
