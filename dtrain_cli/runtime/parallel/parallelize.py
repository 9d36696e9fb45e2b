"""Apply the plan's parallelism to a freshly built model: ``apply_<technique>`` functions.

Fixed order (as in torchtitan): pipeline split -> tensor parallel -> activation
checkpointing (:mod:`.activation_checkpoint`) -> synchronized BatchNorm -> compile -> data
parallel last, by the strategy's runtime half (:mod:`.data_parallel`). Each technique
takes its sub-mesh by name (``ctx.mesh["tp"]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models import ModelSpec, model_spec
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.parallel.data_parallel import DataParallelRuntime, data_parallel_runtime
from dtrain_cli.runtime.parallel.mesh import DistContext


@dataclass(kw_only=True)
class ParallelModel:
    """What this rank runs: its model part(s), the strategy's runtime half that wrapped
    them and, with pp > 1, the pipeline schedule."""

    parts: list[nn.Module]
    stage_ids: list[int]
    num_stages: int
    spec: ModelSpec
    data_parallel: DataParallelRuntime = field(default_factory=DataParallelRuntime)
    schedule: Any | None = None

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def train(self, mode: bool = True) -> None:
        for part in self.parts:
            part.train(mode)

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters() if p.requires_grad]


def build_model(spec: ModelSpec, seed: int, device: torch.device) -> nn.Module:
    """The same weights on every rank for the same seed, whatever the layout: built on the
    CPU from a seeded RNG (so CUDA and CPU runs start alike), then moved."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.build("cpu")
    return model.to(device)


def _build(spec: ModelSpec, seed: int, ctx: DistContext, deferred: bool) -> tuple[nn.Module, Any]:
    """The full model, or (a pipeline stage's launch, a simulation) the model with its
    parameters on the meta device and the record that fills them in (:mod:`.materialize`)."""
    if not (deferred or ctx.simulated):
        return build_model(spec, seed, ctx.device), None
    from dtrain_cli.runtime.parallel.materialize import deferred_build

    return deferred_build(spec, seed, replayable=not ctx.simulated)


def _stage_values(
    parts: list[nn.Module],
    record: Any,
    spec: ModelSpec,
    seed: int,
    ctx: DistContext,
    stage_ids: list[int],
    plan: Plan,
) -> list[nn.Module]:
    """The stage parts with the full model's values, allocating only their own layers; a
    model whose constructor cannot be replayed is built whole and split, as before."""
    from dtrain_cli.runtime.parallel.materialize import replay_init

    if replay_init(parts, record, ctx.device):
        return parts
    assert plan.pipeline is not None
    model = build_model(spec, seed, ctx.device)
    return [spec.pipeline_stage(model, plan.pipeline.stages[s]) for s in stage_ids]


def _stage_io(spec: ModelSpec, model: nn.Module, cfg: DtrainConfig, plan: Plan) -> Any:
    """Every stage's input and output shapes, from the meta model (a simulation)."""
    from dtrain_cli.runtime.parallel.pipeline import stage_io_meta
    from dtrain_cli.strategies import strategy_for

    assert plan.pipeline is not None
    low = plan.precision.autocast_dtype
    dtype = getattr(torch, low) if low else None
    sharded = not strategy_for(plan.strategy).plain_replicas
    return stage_io_meta(spec, model, plan.pipeline, plan.batch.micro_batch_size, dtype, sharded)


def apply_compile(model: nn.Module, spec: ModelSpec, cfg: DtrainConfig) -> nn.Module:
    """``torch.compile`` each block the model's spec names (off by default: no gain for tiny
    models on CPU); a model without blocks is compiled whole."""
    if not cfg.train.compile:
        return model
    blocks = spec.blocks(model)
    if not blocks:
        model.compile()
    for block in blocks:
        block.compile()  # in place: parameter names (and checkpoints) stay the same
    return model


def parallelize(cfg: DtrainConfig, plan: Plan, ctx: DistContext, loss_fn: Any) -> ParallelModel:
    """Build the model through its spec (:mod:`dtrain_cli.models`) and apply the layout."""
    spec = model_spec(cfg)
    pipe = plan.pipeline
    model, record = _build(spec, cfg.train.seed, ctx, deferred=pipe is not None)
    # pipelining (torch._dynamo) and DTensor cost about a second to import: only when used
    if pipe is not None:
        from dtrain_cli.runtime.parallel.pipeline import stages_of_rank

        stage_ids = stages_of_rank(pipe, ctx.mesh["pp"].get_local_rank())
        stage_io = _stage_io(spec, model, cfg, plan) if ctx.simulated else None
        parts: list[nn.Module] = [spec.pipeline_stage(model, pipe.stages[s]) for s in stage_ids]
        del model
        if record is not None and not ctx.simulated:  # a launch: this stage's values only
            parts = _stage_values(parts, record, spec, cfg.train.seed, ctx, stage_ids, plan)
    else:
        stage_ids, parts, stage_io = [0], [model], None
    if ctx.mesh["tp"].size() > 1:
        for part in parts:
            spec.apply_tensor_parallel(part, ctx.mesh["tp"])
    if cfg.parallel.activation_checkpointing != "none":
        from dtrain_cli.runtime.parallel.activation_checkpoint import apply_activation_checkpointing

        for part, s in zip(parts, stage_ids, strict=True):
            first = pipe.stages[s].layers[0] if pipe is not None else 0
            blocks = spec.blocks(part)
            apply_activation_checkpointing(
                part, blocks, cfg.parallel.activation_checkpointing, first
            )
    if cfg.parallel.sync_batchnorm and ctx.dp_mesh.size() > 1:
        from dtrain_cli.runtime.parallel.sync_batchnorm import apply_sync_batchnorm

        parts = [apply_sync_batchnorm(p, ctx.dp_group, ctx.device) for p in parts]
    schedule = pipe.schedule if pipe is not None else None
    dp = data_parallel_runtime(cfg, ctx)
    parts = [dp.apply(apply_compile(p, spec, cfg), spec, cfg, ctx, schedule) for p in parts]
    if ctx.simulated:  # this rank's shards, allocated only now
        from dtrain_cli.runtime.parallel.materialize import allocate_local

        allocate_local(parts, ctx.device)
    pm = ParallelModel(
        parts=parts,
        stage_ids=stage_ids,
        num_stages=pipe.num_stages if pipe else 1,
        spec=spec,
        data_parallel=dp,
    )
    if pipe is not None:
        from dtrain_cli.runtime.parallel.pipeline import build_schedule

        pm.schedule = build_schedule(
            parts, stage_ids, pipe, ctx.device, ctx.mesh["pp"].get_group(), loss_fn, stage_io
        )
    return pm
