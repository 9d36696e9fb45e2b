"""The loop's one sync seam: what a sync mode (``sync.mode``) does around an optimizer step.

    dtrain launch recipe=gpt_tiny dp=2 sync.mode=local_sgd sync.every=8

Every mode's runtime half is a :class:`SyncRuntime`; the plain one (``sync``: the
strategy's own collectives do everything) is this base, whose every method is a no-op.
The trainer calls the hooks at fixed points: after the optimizer step (local SGD's
averaging, DiLoCo's outer step), instead of it (the parameter server), before a save
and validation, at logging steps, at resume and at the end. :func:`sync_runtime` builds
this run's one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.sync_modes import mode_for
from dtrain_cli.sync_modes.base import runtime_part

if TYPE_CHECKING:
    from dtrain_cli.runtime.parallel.parallelize import ParallelModel


class SyncRuntime:
    replaces_optimizer_step = False
    """True: :meth:`optimizer_step` is the step (the local optimizer does not run)."""
    replicas_step_alone = False
    """True: each replica's optimizer steps with a gradient of its own (not the dp average),
    so the logged grad_norm is the mean over replicas of those norms."""

    def __init__(
        self, *, cfg: DtrainConfig, plan: Plan, ctx: DistContext, model: ParallelModel
    ) -> None:
        self.cfg, self.plan, self.ctx, self.model = cfg, plan, ctx, model

    def trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [
            (n, p)
            for part in self.model.parts
            for n, p in part.named_parameters()
            if p.requires_grad
        ]

    # -- start, checkpoint, resume ------------------------------------------------------------
    def start(self, step: int) -> None:
        """Once the loop knows its first step (after a resume: the checkpoint's)."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds for the mode (DCP state dict, under ``sync``)."""
        return {}

    def state_bytes(self) -> int:
        """Bytes of optimizer state the mode keeps besides the optimizer's (the plan's
        :meth:`dtrain_cli.sync_modes.base.SyncMode.optimizer_bytes` counts them too)."""
        return 0

    def on_resume(self, state: dict[str, Any], step: int) -> None:
        """After the checkpoint's model and optimizer were loaded."""

    def before_save(self, step: int) -> None:
        """One model to save (replicas that step alone are averaged first)."""

    def before_validate(self, step: int) -> None:
        pass

    # -- the step ------------------------------------------------------------------------------
    def optimizer_step(self, step: int) -> torch.Tensor:
        raise NotImplementedError(f"sync.mode={self.cfg.sync.mode} keeps the optimizer step")

    def after_optimizer_step(self) -> dict[str, float] | None:
        """Before ``zero_grad``; a ``sync`` record for metrics.jsonl when something happened."""
        return None

    def log_window(self) -> dict[str, Any] | None:
        """At a logging step, on every worker: a ``staleness`` record, or None."""
        return None

    def finish(self, step: int, run_dir: Path) -> dict[str, Any]:
        """At the end (or a preemption stop): one model everywhere; the mode's summary."""
        return {}


def sync_runtime(
    cfg: DtrainConfig, plan: Plan, ctx: DistContext, model: ParallelModel
) -> SyncRuntime:
    """This run's sync mode's runtime half (with dp=1 every mode is the plain step)."""
    mode = mode_for(cfg.sync.mode)
    cls = runtime_part(mode) if plan.dims.dp_enabled or mode.extra_processes(cfg) else SyncRuntime
    return cls(cfg=cfg, plan=plan, ctx=ctx, model=model)
