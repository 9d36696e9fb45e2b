"""The loop's seam for the sync modes that change what an optimizer step is.

    dtrain launch recipe=gpt_tiny dp=2 sync.mode=param_server sync.max_staleness=1
    dtrain launch recipe=gpt_tiny dp=2 sync.mode=diloco sync.every=8

``param_server`` replaces the local optimizer step by push gradient / pull parameters
(:mod:`.ps_worker`); ``diloco`` adds an outer step after the inner one (:mod:`.diloco`).
Both add their state to the checkpoint under ``sync`` (the servers' optimizer state on
rank 0; DiLoCo's anchors, outer momentum and each replica's parameters) and their
observations to the logging steps and the summary. Other modes: every method is a no-op.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.parallel.mesh import DistContext


class ModeSync:
    def __init__(self, cfg: DtrainConfig, plan: Plan, ctx: DistContext, model: Any) -> None:
        self.cfg, self.plan, self.ctx = cfg, plan, ctx
        self.ps = self.diloco = None
        named = [
            (n, p) for part in model.parts for n, p in part.named_parameters() if p.requires_grad
        ]
        if cfg.sync.mode == "param_server":
            from dtrain_cli.runtime.sync.param_server_client import ParamServerClient

            self.ps = ParamServerClient(cfg, plan, ctx.ps, ctx.rank, [p for _, p in named])
        elif cfg.sync.mode == "diloco" and plan.batch.dp > 1:
            from dtrain_cli.runtime.sync.diloco import DiLoCo

            s = cfg.sync
            self.diloco = DiLoCo(
                named, s.every, s.outer_lr, s.outer_momentum, ctx.dp_group, ctx.dp_rank
            )
        self.snapshot: dict[str, Any] = {}
        self.started = self.finished = False

    @property
    def replaces_optimizer_step(self) -> bool:
        return self.ps is not None

    # -- checkpoint ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        if self.ps is not None:
            return self.snapshot or self.ps.state()
        if self.diloco is not None:
            return self.diloco.state()
        return {}

    def after_load(self, state: dict[str, Any], step: int) -> None:
        """After the checkpoint's model and optimizer are loaded."""
        if self.diloco is not None:
            self.diloco.load_state(state)
            self.diloco.set_step(step)
        if self.ps is not None:
            self.start(step, state if self.ctx.rank == 0 else None)

    def start(self, step: int, server_state: dict[str, Any] | None = None) -> None:
        """param_server: seed the servers and pull (once; after a resume, from it)."""
        if self.ps is not None and not self.started:
            self.ps.start(step, server_state)
            self.started = True

    def before_validate(self, step: int) -> None:
        """param_server: every worker validates the same, latest parameters."""
        if self.ps is not None:
            self.ps.pull_latest(step)

    def before_save(self, step: int) -> None:
        if self.ps is not None:
            self.snapshot = self.ps.before_save(step)

    # -- the step ------------------------------------------------------------------------------
    def optimizer_step(self, step: int) -> torch.Tensor:
        assert self.ps is not None
        return self.ps.step(step, self.cfg.optim.grad_clip)

    def after_optimizer_step(self) -> dict[str, float] | None:
        return self.diloco.after_step() if self.diloco is not None else None

    def log_window(self) -> dict[str, Any] | None:
        """At a logging step, on every worker (param_server: one all-reduce among them)."""
        return self.ps.log_window() if self.ps is not None else None

    def finish(self, step: int, run_dir: Path) -> dict[str, Any]:
        """At the end (or a preemption stop), on every worker: one model everywhere, the
        servers told to stop, then the mode's summary."""
        out: dict[str, Any] = {}
        if self.finished:
            return out
        self.finished = True
        if self.diloco is not None:
            self.diloco.finish()
            out.update(self.diloco.summary(step))
        if self.ps is not None:
            out["param_server"] = self.ps.close(step, run_dir)
        if self.plan.sync is not None:
            out["bytes_per_step_per_role_estimate"] = self.plan.sync.bytes_per_step
        return out
