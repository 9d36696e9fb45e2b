"""Elastic membership in the plan: the layout for every node count a run may train on.

    dtrain plan recipe=gpt_tiny parallel.nnodes=1:4 dp=4

With ``parallel.nnodes=MIN:MAX`` the plan at MAX nodes is the run's plan; for each count
from MIN up the same config is planned again with dp scaled to the nodes present
(processes per node, tp and pp stay: they are the model's shape), the micro batch and
the global batch kept, so gradient accumulation rises as dp falls: the optimization and
the LR schedule are those of the full size. A count whose plan fails (the global batch
does not split into micro*dp, a pipeline that no longer divides) is refused with the
reason; a refused MIN is a config error. Workers pick their size's layout by WORLD_SIZE
(:meth:`dtrain_cli.plan.plan.Plan.for_world_size`). Pure, torch-free.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.errors import ConfigError
from dtrain_cli.plan.plan import ElasticPlan, ElasticSize

if TYPE_CHECKING:
    from dtrain_cli.plan.plan import Plan


def elastic_plan(
    cfg: DtrainConfig, full: Plan, build: Callable[[DtrainConfig], Plan]
) -> ElasticPlan:
    """Every count in [MIN, MAX]: its layout, or why it is refused. Raises ConfigError
    when MIN itself is refused (nothing could run with that few nodes)."""
    par = cfg.parallel
    low, high = par.min_nnodes or par.nnodes, par.nnodes
    model_parallel = par.tp * par.pp
    sizes: list[ElasticSize] = []
    refused: dict[int, str] = {}
    for n in range(low, high):
        world = full.nproc_per_node * n
        if world % model_parallel:
            refused[n] = (
                f"{world} processes ({n} x {full.nproc_per_node}) are not a multiple of "
                f"tp*pp = {model_parallel}"
            )
            continue
        sub = copy.deepcopy(cfg)
        sub.parallel.nnodes, sub.parallel.min_nnodes = n, None
        sub.parallel.dp = world // model_parallel
        sub.parallel.nproc_per_node = full.nproc_per_node
        sub.train.global_batch_size = full.batch.global_batch_size
        sub.train.micro_batch_size = full.batch.micro_batch_size
        sub.train.grad_accum = None
        try:
            plan = build(sub)
        except ConfigError as exc:
            refused[n] = f"the global batch cannot be kept: {exc.problems[0]}"
            continue
        sizes.append(_size(plan))
    sizes.append(_size(full))
    if low in refused:
        ok = [s.nnodes for s in sizes]
        raise ConfigError(
            [
                f"parallel.nnodes={low}:{high}: at {low} node(s) {refused[low]}; "
                f"use MIN >= {ok[0]} (admissible: {', '.join(map(str, ok))})"
            ]
        )
    return ElasticPlan(
        min_nnodes=low,
        max_nnodes=high,
        sizes=sizes,
        refused=[{"nnodes": n, "reason": why} for n, why in sorted(refused.items())],
    )


def _size(plan: Plan) -> ElasticSize:
    return ElasticSize(
        nnodes=plan.nnodes,
        world_size=plan.world_size,
        mesh_shape=list(plan.mesh.shape),
        batch=plan.batch,
        pipeline=plan.pipeline,
        threads_per_proc=plan.threads_per_proc,
    )
