"""The loop's validation component: when to validate and the mean val loss.

    dtrain launch recipe=gpt_tiny train.eval_every=50 train.eval_batches=8

``should_validate(step)``: every ``train.eval_every`` steps and at the last step. The
loss is over the first ``eval_batches`` global batches of the val split, as many whole ones
as it holds (a split shorter than one global batch: one, its windows repeated): the same
samples whatever the layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.data.loader import Batches
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.runtime.parallel.parallelize import ParallelModel


class Validator:
    def __init__(
        self,
        cfg: DtrainConfig,
        plan: Plan,
        ctx: DistContext,
        pm: ParallelModel,
        step_fn: Any,
        batches: Batches,
        reports_loss: bool,
    ) -> None:
        self.plan, self.ctx, self.pm, self.step_fn, self.batches = plan, ctx, pm, step_fn, batches
        self.every, self.num_batches = cfg.train.eval_every, cfg.train.eval_batches
        self.reports_loss = reports_loss
        self.last_loss: float | None = None

    def should_validate(self, step: int) -> bool:
        return bool(self.every and step % self.every == 0) or step == self.plan.steps

    @torch.no_grad()  # a graph-building eval forward through DDP perturbs the next steps
    def validate(self) -> float:
        """Mean loss; micro-batches dealt round-robin to dp ranks and grouped by pipeline
        calls. One all-reduce (every rank calls it)."""
        self.pm.train(False)
        micro, dp, r = self.plan.batch.micro_batch_size, self.plan.batch.dp, self.ctx.dp_rank
        group = self.plan.pipeline.microbatches if self.plan.pipeline else 1
        n = len(self.batches)
        # at most the whole split, each window once (past its end the windows came round
        # again and counted twice), in whole global batches: the same samples whatever the
        # layout, and every rank makes the same calls (FSDP's gathers, a pipeline schedule's
        # full group); a split shorter than one global batch: one, wrapped
        gb = self.plan.batch.global_batch_size
        samples = min(self.num_batches, max(n // gb, 1)) * gb
        chunks = list(range(r, samples // micro, dp))
        totals = torch.zeros(2, device=self.ctx.device, dtype=torch.float64)
        for i in range(0, len(chunks), group):
            idx = np.concatenate([np.arange(micro) + c * micro for c in chunks[i : i + group]]) % n
            x, y = self.batches.fetch(idx)
            loss = self.step_fn.eval_loss(x, y)
            if self.reports_loss:
                totals += torch.stack(
                    [loss.double() * len(idx), torch.tensor(len(idx), device=self.ctx.device)]
                )
        dist.all_reduce(totals)
        self.pm.train(True)
        self.last_loss = (totals[0] / totals[1]).item()
        return self.last_loss
