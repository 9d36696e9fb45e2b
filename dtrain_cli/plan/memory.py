"""Per-rank memory and communication estimates for each data-parallel strategy. Pure.

Memory (fp32 master weights; the runtime measures the real bytes and the run summary
shows both): ddp keeps everything on every rank; zero1 shards the optimizer state over
dp; fsdp shards parameters, gradients and optimizer state (plus one gathered block).
Communication: the gradient payload each rank contributes per step and the bytes a ring
moves per rank for it (2 (n-1)/n x payload for an all-reduce). The model's own numbers
(parameters, blocks, activations, FLOPs) come from its spec (:mod:`dtrain_cli.models`).
"""

from __future__ import annotations

import math

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models.spec import ModelFacts, ModelSpec
from dtrain_cli.plan.layout import fsdp_reshards_after_forward, part_activations
from dtrain_cli.plan.plan import BatchPlan, Estimates, PipelinePlan


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


def comm_bytes_per_step(cfg: DtrainConfig, facts: ModelFacts, ddp: bool = False) -> int:
    """Bytes sent per rank per step over the dp group (ring algorithms); ``ddp``: what
    synchronous DDP would send, whatever sync.mode says."""
    dp = cfg.parallel.dp
    n = facts.num_params
    mode = "sync" if ddp else cfg.sync.mode
    if mode == "param_server":  # a worker's gradient push (plan/sync.py has both roles)
        return 4 * n
    if dp <= 1 or mode in ("local_sgd", "diloco"):
        # local SGD / DiLoCo: a parameter (delta) all-reduce every `every` steps, amortized
        if dp > 1:
            return int(2 * (dp - 1) / dp * 4 * n / cfg.sync.every)
        return 0
    ring = (dp - 1) / dp
    n_bytes = 4 * n / max(cfg.parallel.tp * cfg.parallel.pp, 1)
    if cfg.parallel.strategy == "fsdp":
        schedule = cfg.pipeline.schedule if cfg.parallel.pp > 1 else None
        gathers = 2 if fsdp_reshards_after_forward(cfg, schedule) else 1  # fwd (+ bwd)
        return int(ring * n_bytes * (gathers + 1))  # + reduce-scatter of gradients
    payload = grad_payload_bytes(cfg, facts) / max(cfg.parallel.tp * cfg.parallel.pp, 1)
    total = 2 * ring * payload
    if cfg.parallel.strategy == "zero1":
        total += ring * n_bytes  # updated parameter shards broadcast from their owners
    return int(total)


def estimate(
    cfg: DtrainConfig, spec: ModelSpec, batch: BatchPlan, pipeline: PipelinePlan | None = None
) -> Estimates:
    """Per-rank memory (fp32 master weights) and FLOPs per token; estimates, not measurements.
    With pipeline stages, the rank holding the most parameters is the one that must fit."""
    par = cfg.parallel
    facts = spec.facts()
    n = facts.num_params
    whole = facts.params_tp_replicated if par.tp > 1 else 0  # not split by tp
    if pipeline is not None and pipeline.stages:
        held: dict[int, int] = {}
        for st in pipeline.stages:
            held[st.pp_rank] = held.get(st.pp_rank, 0) + st.params
        most = max(held.values())
        rep = whole * most / max(n, 1)
        per_rank = math.ceil((most - rep) / par.tp + rep)
    else:
        per_rank = math.ceil((n / par.pp - whole) / par.tp + whole)
    optim_words = {"adamw": 2, "sgd": 1 if cfg.optim.momentum > 0 else 0}[cfg.optim.name]
    params_b, grads_b = 4 * per_rank, 4 * per_rank
    optim_b = 4 * optim_words * per_rank
    if par.strategy in ("zero1", "fsdp"):
        optim_b = math.ceil(optim_b / par.dp)
    if par.strategy == "fsdp":
        block = 4 * facts.params_per_layer
        params_b = math.ceil(params_b / par.dp) + block  # shard + one gathered block
        grads_b = math.ceil(grads_b / par.dp)
    activations, recompute = rank_activations(cfg, spec, facts, batch, pipeline)
    return Estimates(
        num_params=n,
        params_per_rank=per_rank,
        bytes_params=params_b,
        bytes_grads=grads_b,
        bytes_optimizer=optim_b,
        bytes_activations=activations,
        bytes_total=params_b + grads_b + optim_b + activations + recompute,
        flops_per_token=facts.flops_per_unit,
        comm_bytes_per_step=comm_bytes_per_step(cfg, facts),
        grad_payload_bytes=grad_payload_bytes(cfg, facts),
        bytes_recompute=recompute,
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
        return part_activations(cfg, spec, micro, 0, facts.num_layers, True)
    kept: dict[int, int] = {}
    recompute = 0
    for st in pipeline.stages:
        k, r = part_activations(cfg, spec, micro, st.layers[0], st.layers[1], st.head)
        kept[st.pp_rank] = kept.get(st.pp_rank, 0) + k
        recompute = max(recompute, r)
    return max(kept.values()), recompute
