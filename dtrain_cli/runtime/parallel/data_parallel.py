"""Data parallelism over the mesh's dp axis: the runtime half of a strategy.

    dtrain launch recipe=gpt_small dp=4 parallel.strategy=fsdp

A strategy (:mod:`dtrain_cli.strategies`) names its runtime half, a
:class:`DataParallelRuntime`: how the model is wrapped (:meth:`apply`), which group its
optimizer state is sharded over, how backward sync is skipped on the micro-steps of an
accumulation, what it adds to a checkpoint on this rank, and the timings it reports.
:func:`apply_data_parallel` is what :mod:`.parallelize` calls last.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models import ModelSpec
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.strategies import strategy_for
from dtrain_cli.strategies.base import runtime_part
from dtrain_cli.sync_modes import mode_for


class DataParallelRuntime:
    """The base: nothing to wrap (dp=1, or a sync mode that moves data itself)."""

    def apply(
        self,
        model: nn.Module,
        spec: ModelSpec,
        cfg: DtrainConfig,
        ctx: DistContext,
        schedule: str | None,
    ) -> nn.Module:
        return model

    def optimizer_group(self, ctx: DistContext) -> Any | None:
        """The group the optimizer state is sharded over (ZeRO-1); None: not sharded."""
        return None

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Backward without the gradient sync (the non-final micro-steps of an
        accumulation): DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``."""
        if hasattr(model, "no_sync"):
            with model.no_sync():
                yield
        elif hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        else:
            yield

    def step_times(self, parts: list[nn.Module]) -> dict[str, float]:
        """Forward / backward / communication times of the latest sampled step (ms)."""
        return {}

    def rank_state(self, parts: list[nn.Module]) -> dict[str, torch.Tensor]:
        """State of this rank alone a checkpoint keeps (a comm hook's error feedback)."""
        return {}

    def load_rank_state(
        self, parts: list[nn.Module], state: dict[str, torch.Tensor], step: int
    ) -> None:
        """After a resume at ``step``: what :meth:`rank_state` saved (empty: nothing)."""


def data_parallel_runtime(cfg: DtrainConfig, ctx: DistContext) -> DataParallelRuntime:
    """This run's strategy's runtime half, or the base when no dp wrapper applies."""
    if ctx.mesh is None or ctx.dp_mesh.size() == 1:
        return DataParallelRuntime()
    if not mode_for(cfg.sync.mode).wraps_data_parallel:
        return DataParallelRuntime()  # param_server / diloco move gradients themselves
    return runtime_part(strategy_for(cfg.parallel.strategy))


def apply_data_parallel(
    model: nn.Module,
    spec: ModelSpec,
    cfg: DtrainConfig,
    ctx: DistContext,
    schedule: str | None = None,
) -> nn.Module:
    """Replicas (or shards) over the mesh's dp axis. ``schedule``: the pipeline schedule
    that will drive ``model`` (a stage), None without pipelining."""
    return data_parallel_runtime(cfg, ctx).apply(model, spec, cfg, ctx, schedule)
