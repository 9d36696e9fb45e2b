"""Numerics policy: what a non-finite loss or gradient, or a loss spike, does to the run.

    dtrain launch recipe=gpt_small train.on_nan=skip train.on_spike=rollback

``train.on_nan=stop`` (default) costs nothing per step: at a logging step the reduced
loss (the same on every rank) and the global grad norm are checked; a non-finite one
stops the run, naming the first non-finite step, the rank and the first non-finite
parameter. ``skip`` / ``rollback`` and ``train.on_spike`` decide before every optimizer
step, on one small all-reduce ``[loss, non-finite]`` over WORLD, so every rank takes the
same decision: ``skip`` drops the update (and its LR step) and counts it, stopping after
``train.max_skips`` in a row; ``rollback`` restores the newest complete checkpoint's
model and optimizer and moves on past the data since (:meth:`.Checkpointer.rollback`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dtrain_cli.config.schema import TrainConfig
from dtrain_cli.runtime.components.replica import param_name
from dtrain_cli.runtime.diagnostics.watchdog import COLLECTIVES
from dtrain_cli.runtime.parallel.dtensors import local_tensor
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.runtime.parallel.parallelize import ParallelModel

log = logging.getLogger("dtrain")


class NumericsError(RuntimeError):
    """The run stopped on a non-finite value or a loss spike (the message says where)."""


class SpikeDetector:
    """A loss above ``threshold`` x the median of the last ``window`` accepted losses (after
    at least ``min(window, 5)`` of them)."""

    def __init__(self, threshold: float, window: int) -> None:
        self.threshold = threshold
        self.history: deque[float] = deque(maxlen=window)
        self.min_history = min(window, 5)

    def is_spike(self, loss: float) -> bool:
        if len(self.history) < self.min_history:
            return False
        return loss > self.threshold * float(np.median(self.history))

    def accept(self, loss: float) -> None:
        self.history.append(loss)


def first_non_finite(pm: ParallelModel) -> str | None:
    """The first parameter (or its gradient) with a non-finite value on this rank."""
    for part in pm.parts:
        for name, p in part.named_parameters():
            if not bool(local_tensor(p.detach()).isfinite().all()):
                return f"parameter {param_name(name)}"
            if p.grad is not None and not bool(local_tensor(p.grad).isfinite().all()):
                return f"gradient of {param_name(name)}"
    return None


class NumericsPolicy:
    def __init__(
        self, train: TrainConfig, ctx: DistContext, pm: ParallelModel, dp: int, reports_loss: bool
    ) -> None:
        self.ctx, self.pm, self.dp, self.reports_loss = ctx, pm, dp, reports_loss
        self.on_nan, self.on_spike, self.max_skips = train.on_nan, train.on_spike, train.max_skips
        self.spikes = SpikeDetector(train.spike_threshold, train.spike_window)
        self.per_step = self.on_nan != "stop" or self.on_spike != "off"
        self.skips_in_row = 0
        self.counts = {
            "nan_skipped": 0,
            "nan_rollbacks": 0,
            "spike_skipped": 0,
            "spike_rollbacks": 0,
        }
        self.events: list[dict[str, Any]] = []
        self.rollback_due = False
        self.rollback_why = ("nan", "")  # (kind, what) of the rollback due
        self.last_allowed = True

    # -- per step (skip / rollback / spikes only) ----------------------------------------------
    def allow(self, step: int, loss: torch.Tensor, norm: torch.Tensor | None) -> bool:
        """Before the optimizer step of ``step``: True steps; False drops the update (a
        rollback then follows: :attr:`rollback_due`). Raises :class:`NumericsError` to stop."""
        self.last_allowed = self._decide(step, loss, norm)
        return self.last_allowed

    def _decide(self, step: int, loss: torch.Tensor, norm: torch.Tensor | None) -> bool:
        flags = torch.zeros(2, device=self.ctx.device, dtype=torch.float64)
        if self.reports_loss:
            flags[0] = loss.double()
        if norm is not None:
            flags[1] = (~torch.isfinite(norm)).any().double()
        with COLLECTIVES.enter("all_reduce", step, "numerics"):
            dist.all_reduce(flags)
        total, non_finite = flags.tolist()
        mean = total / self.dp
        if non_finite > 0 or not math.isfinite(mean):
            kind, action = "nan", self.on_nan
        elif self.on_spike != "off" and self.spikes.is_spike(mean):
            kind, action = "spike", self.on_spike
        else:
            self.spikes.accept(mean)
            self.skips_in_row = 0
            return True
        what = "a non-finite loss or gradient" if kind == "nan" else f"a loss spike ({mean:.4g})"
        if action == "stop":
            here = step if not bool(torch.isfinite(loss).all()) else None
            detail = self._locate(step, here) if kind == "nan" else what
            raise NumericsError(f"step {step}: {detail}; train.on_{kind}=stop")
        self.events.append({"step": step, "kind": kind, "action": action, "loss": mean})
        if action == "skip":
            self.counts[f"{kind}_skipped"] += 1
            self.skips_in_row += 1
            log.warning("step %d: %s: update skipped (train.on_%s=skip)", step, what, kind)
            if self.skips_in_row >= self.max_skips:
                raise NumericsError(
                    f"step {step}: {self.skips_in_row} steps skipped in a row "
                    f"(train.max_skips={self.max_skips}); the last: {what}"
                )
            return False
        self.counts[f"{kind}_rollbacks"] += 1
        self.rollback_due = True
        self.rollback_why = (kind, what)
        log.warning("step %d: %s: rolling back (train.on_%s=rollback)", step, what, kind)
        return False

    def rolled_back(self, step: int, restored: int | None) -> None:
        self.rollback_due = False
        if restored is None:  # the launcher's report names the step
            kind, what = self.rollback_why
            raise NumericsError(
                f"train.on_{kind}=rollback: {what} before the run's first complete "
                f"checkpoint, so there is nothing to restore; save earlier (a smaller "
                f"checkpoint.every_steps) or use train.on_{kind}=skip"
            )
        log.warning(
            "step %d: restored checkpoint step %d; the data of steps %d-%d is skipped",
            step,
            restored,
            restored + 1,
            step,
        )

    # -- at logging steps (on_nan=stop) ---------------------------------------------------------
    def check_window(
        self, step: int, loss: float, norm: torch.Tensor | None, losses: list, counted: int
    ) -> None:
        """``loss`` is the reduced window loss (the same on every rank), so every rank takes
        this branch together; the rare path gathers where each rank first saw it.
        ``counted``: the steps the loss counts; none (a spike skipped or rolled back every
        step of the window) leaves no loss to check, not a NaN."""
        bad_norm = norm is not None and not bool(torch.isfinite(norm).all())
        if (math.isfinite(loss) or not counted) and not bad_norm:
            return
        first = step - len(losses) + 1
        local = [i for i, v in enumerate(losses) if not bool(torch.isfinite(v).all())]
        detail = self._locate(step, first + local[0] if local else None)
        raise NumericsError(f"{detail}; train.on_nan=stop (skip or rollback continue past it)")

    def _locate(self, step: int, local_step: int | None) -> str:
        """Every rank: where each rank first saw a non-finite value (rare path: a gather)."""
        mine = (local_step, first_non_finite(self.pm))
        rows: list[Any] = [None] * self.ctx.world_size
        with COLLECTIVES.enter("all_gather_object", step, "numerics"):
            dist.all_gather_object(rows, mine)
        seen = [(s, r, w) for r, (s, w) in enumerate(rows) if s is not None or w is not None]
        if not seen:
            return f"non-finite global gradient norm by step {step}"
        seen.sort(key=lambda t: (t[0] if t[0] is not None else step + 1, t[1]))
        bad_step, rank, where = seen[0]
        return f"non-finite loss or gradient at step {bad_step or step} on rank {rank}" + (
            f" (first non-finite: {where})" if where else ""
        )

    def summary(self) -> dict[str, Any]:
        return {"numerics": {**self.counts, "events": self.events}}
