"""What a worker imports before its first step, so the launcher can import it once.

With ``start_method=fork`` the elastic agent imports these modules before it starts the
workers, which inherit them (one import on one core instead of one per worker); with
``forkserver`` they are the server's preload list (:mod:`.worker_server`,
:mod:`.server_preload`). Modules a run does not use before step 1 stay out:
``torch.distributed.checkpoint`` (about 0.7 s) is imported at the first save, pipelining
and DTensor (about 1 s together) only when the layout uses them. Every name here must
resolve (``tests/unit/test_startup.py`` checks them with ``importlib.util.find_spec``): a name
that does not is a speed-up silently lost.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.mesh.dims import ParallelDims
from dtrain_cli.plan.plan import Plan

WORKER_ENTRY = "dtrain_cli.runtime.worker:worker_main"
"""What every rank of ``dtrain launch`` runs (torch's function entry, ``@record``)."""
SCRIPT_ENTRY = "dtrain_cli.runtime.script.worker:script_main"
"""``dtrain run``: one rank of your script, forked (fork, forkserver)."""
SCRIPT_MODULE = "dtrain_cli.runtime.script.worker"
"""``dtrain run`` with spawn: ``python -u -c 'import SCRIPT_MODULE ... main()'`` per rank."""
CLUSTER_CHECK_ENTRY = "dtrain_cli.runtime.diagnostics.collective_check:check_main"
"""``dtrain validate-cluster``'s live check on every rank."""
WORKER_FIRST = ("dtrain_cli.runtime.worker",)
"""What the server imports at once, before the plan exists: dtrain's worker."""
SCRIPT_FIRST = ("dtrain_cli.runtime.script.worker", "torch", "torch.distributed")
"""``dtrain run``: your script's workers need torch, not dtrain's trainer."""
SCRIPT_PRELOAD = (
    "dtrain_cli.runtime.script.worker",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.utils.data",
)
"""Modules a typical DDP script imports before its first step (a speed-up only: a script
that uses none loses nothing)."""
CHECKPOINT_MODULES = (
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "dtrain_cli.checkpoint.safe_load",
)
TENSOR_PARALLEL_MODULES = ("torch.distributed.tensor", "torch.distributed.tensor.parallel")
PIPELINE_MODULES = ("dtrain_cli.runtime.parallel.pipeline",)


def entry_point(path: str) -> Callable[..., Any]:
    """``module:function`` -> the function. The launcher names the workers' code by path,
    as torchrun names a script: it never imports the runtime for anything else."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def modules_before_first_step(cfg: DtrainConfig, plan: Plan, resuming: bool) -> list[str]:
    """Importable module names, cheapest first; importing them is optional (a speed-up)."""
    from dtrain_cli.models import model_spec

    mods = [*WORKER_FIRST, *_layout_modules(plan.dims, plan.strategy, cfg.train.compile)]
    if resuming:
        mods.extend(CHECKPOINT_MODULES)
    return mods + model_spec(cfg).worker_modules()


def modules_known_once_composed(cfg: DtrainConfig) -> list[str]:
    """What the composed config alone says the workers will import (its layout's and its
    model kind's modules), for the fork server to import while the plan is still being made
    (a model of your own is built on the meta device for it, seconds). A config the plan
    will refuse gets what it names, or nothing: the server's imports are only a speed-up."""
    from dtrain_cli.models import model_spec

    par = cfg.parallel
    try:
        dims = ParallelDims(pp=par.pp, dp=par.dp, tp=par.tp, dp_replicate=1)
        layout = _layout_modules(dims, par.strategy, cfg.train.compile)
        return [*layout, *model_spec(cfg).worker_modules()]
    except Exception:  # an unknown strategy or model kind: the plan says so
        return []


def _layout_modules(dims: ParallelDims, strategy: str, compile: bool) -> list[str]:
    from dtrain_cli.strategies import strategy_for

    mods = []
    if dims.dp_enabled or compile:
        # DistributedDataParallel's constructor touches torch._dynamo (about 1 s)
        mods.append("torch._dynamo")
    if dims.dp_enabled:
        mods.extend(strategy_for(strategy).worker_modules)
    if dims.tp_enabled:
        mods.extend(TENSOR_PARALLEL_MODULES)
    if dims.pp_enabled:
        mods.extend(PIPELINE_MODULES)
    return mods


def script_preload(plan: Plan) -> list[str]:
    return [*SCRIPT_PRELOAD, *(["torch._dynamo"] if plan.world_size > 1 else [])]


def worker_modules(run_dir: Path, cfg: DtrainConfig, plan: Plan) -> list[str]:
    """What this run's workers import before step 1: your script's, or dtrain's worker's."""
    from dtrain_cli.checkpoint.catalog import has_checkpoint

    if plan.script is not None:
        return script_preload(plan)
    return modules_before_first_step(cfg, plan, resuming=has_checkpoint(run_dir))
