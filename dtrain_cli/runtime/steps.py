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

import contextlib
from typing import Any

import torch

from dtrain_cli.mesh.schedules import V_SHAPED
from dtrain_cli.models import ModelSpec
from dtrain_cli.models.losses import resolve_loss
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.data.loader import Batches
from dtrain_cli.runtime.parallel.parallelize import ParallelModel
from dtrain_cli.runtime.state.precision import Precision


def forward_loss_fn(spec: ModelSpec, plan: Plan, roots: list[str]) -> Any:
    """``(model, inputs, targets) -> loss`` for ``train.loss`` (resolved in the plan)."""
    fn = resolve_loss(plan.loss, roots)
    if fn is None:  # train.loss=model: the model's forward(inputs, targets) computes it
        return spec.forward_loss
    return lambda model, x, y: fn(model(x), y)


def output_loss_fn(spec: ModelSpec, plan: Plan, roots: list[str]) -> Any:
    """``(outputs, targets) -> loss`` on a pipeline's last stage (which returns outputs)."""
    return resolve_loss(plan.loss, roots) or spec.loss


class LocalStep:
    def __init__(
        self, pm: ParallelModel, plan: Plan, precision: Precision, roots: list[str]
    ) -> None:
        self.model = pm.parts[0]
        self.no_sync = pm.data_parallel.no_sync  # the strategy's backward-sync control
        self.accum = plan.batch.grad_accum
        self.precision = precision
        self.loss = forward_loss_fn(pm.spec, plan, roots)

    def __call__(self, batches: Batches, step: int) -> torch.Tensor:
        if self.accum == 1:  # the common case, without accumulation bookkeeping
            x, y = batches.micro_batch(step, 0)
            with self.precision.autocast():
                loss = self.loss(self.model, x, y)
            self.precision.backward(loss)
            return loss.detach()
        losses = []
        for k in range(self.accum):
            x, y = batches.micro_batch(step, k)
            last = k == self.accum - 1  # only the last micro-step syncs gradients
            with contextlib.nullcontext() if last else self.no_sync(self.model):
                with self.precision.autocast():
                    loss = self.loss(self.model, x, y) / self.accum
                self.precision.backward(loss)
            losses.append(loss.detach())
        return torch.stack(losses).sum()

    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():
            return self.loss(self.model, x, y)


class PipelineStep:
    def __init__(
        self, pm: ParallelModel, plan: Plan, precision: Precision, roots: list[str]
    ) -> None:
        assert plan.pipeline is not None and pm.schedule is not None
        self.pm = pm
        self.schedule = pm.schedule
        self.m = plan.pipeline.microbatches
        self.calls = plan.pipeline.calls_per_step
        self.v_shaped = plan.pipeline.schedule in V_SHAPED
        self.precision = precision
        self._scale = 1.0 / (self.calls * self.m)
        self.output_loss = output_loss_fn(pm.spec, plan, roots)

    def loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Called by the schedule on the last stage for each micro-batch, scaled so that
        the step's gradients (all calls accumulated) are those of the mean loss."""
        return self.precision.scale(self.output_loss(output, target) * self._scale)

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
