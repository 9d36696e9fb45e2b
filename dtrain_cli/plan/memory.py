"""Per-rank memory and communication estimates of a layout. Pure.

Memory (fp32 master weights; the runtime measures the real bytes and the run summary
shows both): what the strategy keeps per rank of the unsharded sizes
(:meth:`dtrain_cli.strategies.base.Strategy.memory_bytes`), with the optimizer state the
sync mode adds or moves (:meth:`dtrain_cli.sync_modes.base.SyncMode.optimizer_bytes`:
DiLoCo's outer state, none on a parameter server's workers). Communication: the gradient
payload each rank contributes per step and the bytes a ring moves per rank for it (2
(n-1)/n x payload for an all-reduce), as the strategy and the sync mode send it. The
model's own numbers (parameters, blocks, activations, FLOPs) come from its spec
(:mod:`dtrain_cli.models`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.mesh.dims import ParallelDims
from dtrain_cli.models.spec import ModelFacts, ModelSpec
from dtrain_cli.plan.layout import fsdp_gathers, part_activations
from dtrain_cli.plan.plan import BatchPlan, Estimates, PipelinePlan
from dtrain_cli.strategies import names as strategy_names
from dtrain_cli.strategies import strategy_for
from dtrain_cli.sync_modes import mode_for


def grad_payload_bytes(cfg: DtrainConfig, facts: ModelFacts) -> int:
    """Bytes of gradient each rank hands to the collective per step, after compression."""
    n = facts.num_params
    comp = cfg.comm.compression
    if comp in ("fp16", "bf16"):
        return 2 * n
    if comp == "powersgd":
        mats = facts.matrix_shapes
        other = n - sum(a * b for a, b in mats)
        r = cfg.comm.powersgd_rank
        low_rank = sum(min(a, b, r) * (a + b) if min(a, b) > r else a * b for a, b in mats)
        return 4 * (low_rank + other)
    return 4 * n


def tp_pp_params(facts: ModelFacts, tp: int, pp: int) -> float:
    """The parameters one rank holds (synchronizes) at tp x pp, on average over the stages:
    its stage's share (1/pp), split over tp but for what every tp rank holds whole."""
    whole = facts.params_tp_replicated / max(pp, 1) if tp > 1 else 0.0
    return (facts.num_params / max(pp, 1) - whole) / max(tp, 1) + whole


def stage_held_params(facts: ModelFacts, tp: int, pipeline: PipelinePlan) -> float:
    """The parameters the pp rank holding the most holds after tp (the one that must fit)."""
    return max(held_by_pp_rank(facts, tp, pipeline).values())


def held_by_pp_rank(facts: ModelFacts, tp: int, pipeline: PipelinePlan) -> dict[int, float]:
    """pp rank -> the parameters it holds after tp: its stages' parameters, split over tp
    but for what every tp rank holds whole there (by place where the kind says,
    :attr:`ModelFacts.tp_replicated_places`: a first stage holds the position embedding
    whole; else that stage's share of the whole in proportion)."""
    by_place = dict(facts.tp_replicated_places)
    held: dict[int, float] = {}
    for st in pipeline.stages:
        if tp <= 1:
            whole = 0.0
        elif by_place:
            where = [*range(*st.layers), *(["first"] if st.embeddings else [])]
            whole = sum(by_place.get(w, 0) for w in where + (["last"] if st.head else []))
        else:
            whole = facts.params_tp_replicated * st.params / max(facts.num_params, 1)
        held[st.pp_rank] = held.get(st.pp_rank, 0.0) + (st.params - whole) / tp + whole
    return held


def rank_held_params(facts: ModelFacts, tp: int, pp: int, pipeline: PipelinePlan | None) -> float:
    """The parameters the rank holding the most holds (and synchronizes over dp) at tp x
    pp: :func:`stage_held_params` with stages, else the even share :func:`tp_pp_params`."""
    if pipeline is not None and pipeline.stages:
        return stage_held_params(facts, tp, pipeline)
    return tp_pp_params(facts, tp, pp)


def comm_bytes_per_step(
    cfg: DtrainConfig,
    facts: ModelFacts,
    ddp: bool = False,
    *,
    grad_accum: int = 1,
    pipeline: PipelinePlan | None = None,
) -> int:
    """Bytes sent per rank per step over the dp group (ring algorithms): the strategy's
    every-step synchronization, or what the sync mode sends instead; ``ddp``: what
    synchronous DDP would send, whatever the config says. ``grad_accum`` and ``pipeline``
    count FSDP's re-gathers (:func:`.layout.fsdp_gathers`)."""
    par = cfg.parallel
    dims = ParallelDims(pp=par.pp, dp=max(par.dp, 1), tp=par.tp)
    strategy = strategy_for(strategy_names()[0] if ddp else par.strategy)  # ddp: the plain one
    if not ddp:
        dims = replace(dims, dp_replicate=strategy.dp_replicate(cfg, nproc_guess(cfg)))
    # of the model's parameters, on the rank holding the most
    held = rank_held_params(facts, par.tp, par.pp, pipeline) / max(facts.num_params, 1)
    pad = fsdp_padding(facts, dims.dp_shard, par.tp) if strategy.shards_params else 1.0
    strategy_bytes = strategy.comm_bytes_per_step(
        param_bytes=4 * facts.num_params * held * pad,
        payload_bytes=grad_payload_bytes(cfg, facts) * held,
        dims=dims,
        gathers=math.prod(fsdp_gathers(cfg, grad_accum, pipeline)),
        gather_scale=0.5 if cfg.precision.name in ("bf16", "fp16") else 1.0,
    )
    if ddp:
        return strategy_bytes
    return mode_for(cfg.sync.mode).comm_bytes_per_step(cfg, facts, strategy_bytes)


def fsdp_padding(facts: ModelFacts, shard: int, tp: int) -> float:
    """FSDP2's padded parameter size over the unpadded: it splits each tensor's dim 0
    (after tp's split) into ``shard`` chunks of ceil(rows / shard) rows, padding the last
    ones; dp rank 0 holds padded / shard, and each all-gather or reduce-scatter moves the
    padded tensor. 1.0 when the model's tensor shapes are unknown."""
    if shard <= 1 or not facts.param_rows:
        return 1.0
    whole = padded = 0.0
    for rows, numel, tp_dim in facts.param_rows:
        local = numel / (tp if tp_dim is not None else 1)
        local_rows = max(rows // tp if tp_dim == 0 else rows, 1)
        whole += local
        padded += math.ceil(local_rows / shard) * shard * local / local_rows
    return padded / whole if whole else 1.0


def stage_tensors(facts: ModelFacts, pipeline: PipelinePlan | None) -> list[tuple[int, int]]:
    """(numel, dims) of every parameter on the pp rank holding the most (the whole model
    without a pipeline), from ``facts.tensor_sizes``; empty when the kind does not say."""
    sizes = facts.tensor_sizes
    if pipeline is None or not pipeline.stages or not sizes:
        return [(n, d) for n, d, _ in sizes]
    by_place: dict[str | int, list[tuple[int, int]]] = {}
    for n, d, where in sizes:
        by_place.setdefault(where, []).append((n, d))
    held: dict[int, list[tuple[int, int]]] = {}
    for st in pipeline.stages:
        mine = held.setdefault(st.pp_rank, [])
        places = [*range(*st.layers), *(["first"] if st.embeddings else [])]
        for place in places + (["last"] if st.head else []):
            mine += by_place.get(place, [])
    return max(held.values(), key=lambda ts: sum(n for n, _ in ts))


def optimizer_share(
    strategy: str, facts: ModelFacts, pipeline: PipelinePlan | None, dims: ParallelDims
) -> float:
    """The share of the optimizer state (and of the optimizer step's parameters) on the dp
    rank holding the most (:meth:`dtrain_cli.strategies.base.Strategy.optimizer_share`),
    for the pp rank holding the most; the tensors are read only when they matter."""
    s = strategy_for(strategy)
    return s.optimizer_share(stage_tensors(facts, pipeline) if s.shards_whole_tensors else [], dims)


def nproc_guess(cfg: DtrainConfig) -> int:
    """Processes per node as the plan derives them (for a strategy's per-node groups)."""
    par = cfg.parallel
    world = max(par.dp, 1) * par.tp * par.pp
    return par.nproc_per_node or max(1, world // max(par.nnodes, 1))


def estimate(
    cfg: DtrainConfig,
    spec: ModelSpec,
    batch: BatchPlan,
    pipeline: PipelinePlan | None,
    dims: ParallelDims,
) -> Estimates:
    """Per-rank memory (fp32 master weights) and FLOPs per token; estimates, not measurements.
    With pipeline stages, the rank holding the most parameters is the one that must fit."""
    par = cfg.parallel
    facts = spec.facts()
    n = facts.num_params
    per_rank = math.ceil(rank_held_params(facts, par.tp, par.pp, pipeline))
    optim_words = {"adamw": 2, "sgd": 1 if cfg.optim.momentum > 0 else 0}[cfg.optim.name]
    strategy = strategy_for(par.strategy)
    sharded = strategy.shards_params and dims.dp_shard > 1
    params_b, grads_b, optim_b = strategy.memory_bytes(
        params=4 * per_rank,
        grads=4 * per_rank,
        optimizer=4 * optim_words * per_rank,
        padding=fsdp_padding(facts, dims.dp_shard, par.tp) if sharded else 1.0,
        optimizer_share=optimizer_share(par.strategy, facts, pipeline, dims),
        dims=dims,
    )
    optim_b = mode_for(cfg.sync.mode).optimizer_bytes(cfg, per_rank, optim_b)
    gathered = 4 * facts.params_per_layer // max(par.tp, 1) if sharded else 0
    activations, recompute = rank_activations(cfg, spec, facts, batch, pipeline)
    return Estimates(
        num_params=n,
        params_per_rank=per_rank,
        bytes_params=params_b,
        bytes_grads=grads_b,
        bytes_optimizer=optim_b,
        bytes_activations=activations,
        bytes_total=params_b + grads_b + optim_b + activations + recompute + gathered,
        flops_per_token=facts.flops_per_unit,
        comm_bytes_per_step=comm_bytes_per_step(
            cfg, facts, grad_accum=batch.grad_accum, pipeline=pipeline
        ),
        grad_payload_bytes=grad_payload_bytes(cfg, facts),
        bytes_recompute=recompute,
        bytes_gathered=gathered,
        activation_checkpointing=par.activation_checkpointing,
    )


def rank_activations(
    cfg: DtrainConfig,
    spec: ModelSpec,
    facts: ModelFacts,
    batch: BatchPlan,
    pipeline: PipelinePlan | None,
) -> tuple[int, int]:
    """(kept for backward, recomputation peak) of one micro-batch on the rank holding the
    most: the whole model, or the pp rank whose stages keep the most."""
    micro = batch.micro_batch_size
    if pipeline is None or not pipeline.stages:
        return part_activations(cfg, spec, micro, 0, facts.num_layers, True, True)
    kept: dict[int, int] = {}
    recompute = 0
    for st in pipeline.stages:
        k, r = part_activations(
            cfg, spec, micro, st.layers[0], st.layers[1], st.embeddings, st.head
        )
        kept[st.pp_rank] = kept.get(st.pp_rank, 0) + k
        recompute = max(recompute, r)
    return max(kept.values()), recompute
