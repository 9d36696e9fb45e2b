"""The runtime half of ``sync.mode=local_sgd``: periodic model averaging.

    dtrain launch recipe=gpt_small dp=4 sync.mode=local_sgd sync.every=8

torch's post-local-SGD DDP hook (gradients all-reduced during ``sync.warmup_steps``, not
after) and ``PeriodicModelAverager`` after the optimizer step; the drift each averaging
removes is logged. Before a save and at the end the replicas are averaged once more, so
one model is saved.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.runtime.sync.base import SyncRuntime


def post_local_sgd_hook(cfg: DtrainConfig, group: dist.ProcessGroup) -> tuple[Any, Any]:
    """(hook, state) for DDP: all-reduce during warm-up, replicas step alone after."""
    state = PostLocalSGDState(
        process_group=group,
        subgroup=None,
        start_localSGD_iter=cfg.sync.warmup_steps,
        post_local_gradient_allreduce=False,  # replicas step alone; averaged periodically
    )
    return post_localSGD_hook, state


class LocalSGD:
    """Periodic model averaging (torch's ``PeriodicModelAverager``) after the optimizer
    step. Logs how far replicas drifted apart before each averaging."""

    def __init__(self, cfg: DtrainConfig, params: list[nn.Parameter], group: Any) -> None:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        with warnings.catch_warnings():  # period 1: the plan's warnings said it already
            warnings.filterwarnings("ignore", message="When period is 1")
            self.averager = PeriodicModelAverager(
                period=cfg.sync.every, warmup_steps=cfg.sync.warmup_steps, process_group=group
            )
        self.params = params
        self.group = group
        self.last_divergence: float | None = None
        self.identical_after = True

    def after_step(self) -> None:
        """Average now if this is an averaging step; record the divergence it removed (the
        largest relative distance of a replica from the average) and check that replicas
        are identical afterwards."""
        step = self.averager.step
        averaging = step >= self.averager.warmup_steps and (
            (step - self.averager.warmup_steps) % self.averager.period == 0
        )
        before = [p.detach().clone() for p in self.params] if averaging else None
        self.averager.average_parameters(self.params)
        if before is not None:
            self.last_divergence = self._divergence(before)
            self.identical_after = self.replicas_identical()

    def _divergence(self, before: list[torch.Tensor]) -> float:
        pairs = zip(before, self.params, strict=True)
        diff = torch.stack([(b - p.detach()).norm() ** 2 for b, p in pairs]).sum().sqrt()
        size = torch.stack([p.detach().norm() ** 2 for p in self.params]).sum().sqrt()
        rel = (diff / size).reshape(1)
        dist.all_reduce(rel, op=dist.ReduceOp.MAX, group=self.group)
        return float(rel)

    def replicas_identical(self) -> bool:
        total = torch.stack([p.detach().double().sum() for p in self.params]).sum()
        both = torch.stack([total, -total])
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        return bool(both[0] == -both[1])

    def average_now(self) -> None:
        """Average outside the period (before a checkpoint, at the end): one model to save."""
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        average_parameters(iter(self.params), self.group)

    def set_step(self, step: int) -> None:
        self.averager.step = step


class LocalSGDSync(SyncRuntime):
    """Local SGD as the loop's sync seam: DDP's post-local-SGD hook, parameters averaged
    every ``sync.every`` steps after the warm-up."""

    replicas_step_alone = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        params = [p for _, p in self.trainable()]
        self.local_sgd = LocalSGD(self.cfg, params, self.ctx.dp_group)

    def on_resume(self, state: dict[str, Any], step: int) -> None:
        self.local_sgd.set_step(step)
        for part in self.model.parts:
            if hasattr(getattr(part, "comm_state", None), "iter"):
                part.comm_state.iter = step  # post-local-SGD warm-up counts steps

    def after_optimizer_step(self) -> dict[str, float] | None:
        self.local_sgd.after_step()
        drift = self.local_sgd.last_divergence
        if drift is None:
            return None
        self.local_sgd.last_divergence = None
        return {"divergence": drift, "identical_after": float(self.local_sgd.identical_after)}

    def before_save(self, step: int) -> None:
        self.local_sgd.average_now()  # replicas may differ between averagings

    def finish(self, step: int, run_dir: Path) -> dict[str, Any]:
        self.local_sgd.average_now()
        return {}
