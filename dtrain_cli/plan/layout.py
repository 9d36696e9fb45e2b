"""Batch split and model-parallel layout of a plan: micro-batches, tensor-parallel checks,
pipeline stages and schedule constraints. Pure; each function appends to ``problems``."""

from __future__ import annotations

import math

from dtrain_cli.config.schema import DtrainConfig, ModelConfig
from dtrain_cli.plan.plan import BatchPlan, PipelinePlan, StagePlan

# Schedules of torch.distributed.pipelining, by dtrain name.
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "looped_bfs": "LoopedBFS",
    "interleaved_zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
SINGLE_STAGE = {"gpipe", "1f1b"}  # one stage per rank
V_SHAPED = {"zbv", "dualpipev"}  # exactly two stages per rank, placed in a V
# Zero-bubble schedules split backward into input and weight passes and set weight
# gradients themselves: DDP's autograd hooks never see them, so dp runs torch's replicate.
SPLIT_BACKWARD = {"interleaved_zb", "zbv", "dualpipev"}
BUBBLE_WARN = 0.25
BYTES_PER_ACTIVATION = {"fp32": 4, "bf16": 2, "fp16": 2}


def fsdp_reshards_after_forward(cfg: DtrainConfig, schedule: str | None) -> bool:
    """``parallel.reshard_after_forward``, except under a zero-bubble schedule: its weight
    pass takes the stage's registered parameters, which must still be the gathered ones."""
    return cfg.parallel.reshard_after_forward and schedule not in SPLIT_BACKWARD


def params_per_layer(m: ModelConfig) -> int:
    """One transformer block of :class:`dtrain_cli.runtime.model.GPT`."""
    d, b = m.n_embd, int(m.bias)
    return 12 * d * d + 9 * d * b + 2 * d * (1 + b)


def activation_bytes_per_layer(cfg: DtrainConfig, micro_batch: int) -> float:
    """Korthikanti et al. 2022: s*b*d*(34 + 5*a*s/d) bytes per layer at 2-byte activations."""
    m = cfg.model
    s, d, a = m.block_size, m.n_embd, m.n_head
    scale = BYTES_PER_ACTIVATION[cfg.precision.name] / 2
    return s * micro_batch * d * (34 + 5 * a * s / d) * scale / max(cfg.parallel.tp, 1)


def batch_layout(cfg: DtrainConfig, problems: list[str]) -> BatchPlan:
    """global = micro * grad_accum * dp. An unset micro batch takes the whole per-rank share
    (no accumulation) or, with pp > 1, splits it into pipeline micro-batches."""
    tr, par = cfg.train, cfg.parallel
    dp = max(par.dp, 1)
    micro, accum = tr.micro_batch_size, tr.grad_accum
    global_batch = tr.global_batch_size
    if global_batch is None:
        micro = micro or 8
        accum = accum or (cfg.pipeline.microbatches or 1 if par.pp > 1 else 1)
        global_batch = micro * accum * dp
    else:
        if global_batch % dp:
            problems.append(
                f"train.global_batch_size={global_batch}: not divisible by dp={dp}; "
                f"use a multiple of {dp}"
            )
        share = max(1, global_batch // dp)
        if micro is None:
            wanted = 1
            if par.pp > 1:
                stages = par.pp * cfg.pipeline.virtual_stages
                wanted = cfg.pipeline.microbatches or min(share, 2 * stages)
                if share % wanted:
                    problems.append(
                        f"pipeline.microbatches={wanted}: must divide the {share} samples each "
                        f"dp rank runs per step (global_batch_size/dp)"
                    )
            micro = max(1, share // wanted)
        per_step = micro * dp
        if global_batch % per_step:
            problems.append(
                f"train.global_batch_size={global_batch}: not divisible by micro_batch_size*dp "
                f"= {micro}*{dp} = {per_step}; use a multiple of {per_step}"
            )
        accum = max(1, global_batch // per_step)
    seq = cfg.model.block_size
    return BatchPlan(micro, accum, dp, global_batch, seq, global_batch * seq)


def tensor_parallel_problems(m: ModelConfig, tp: int, pp: int, problems: list[str]) -> None:
    if tp > 1:
        sizes = {
            "model.n_head": m.n_head,
            "model.n_embd": m.n_embd,
            "model.vocab_size": m.vocab_size,
        }
        allowed = [t for t in range(1, m.n_head + 1) if all(v % t == 0 for v in sizes.values())]
        for key, value in sizes.items():
            if value % tp:
                problems.append(
                    f"{key}={value}: not divisible by tp={tp}; this model allows tp in {allowed}"
                )
    if m.tie_embeddings and (tp > 1 or pp > 1):
        problems.append(
            "model.tie_embeddings=true: not supported with tp > 1 or pp > 1 "
            "(the embedding and the head live on different shards/stages)"
        )


def stage_layers(
    m: ModelConfig, num_stages: int, split: list[int] | None, pp: int, problems: list[str]
) -> list[list[int]]:
    if split is not None:
        if len(split) != num_stages or sum(split) != m.n_layer or min(split) < 1:
            problems.append(
                f"pipeline.layers_per_stage={split}: needs {num_stages} entries >= 1 "
                f"(pp*virtual_stages) summing to model.n_layer={m.n_layer}"
            )
            return []
        counts = split
    else:
        if m.n_layer % num_stages:
            where = f"pp={pp}" if num_stages == pp else f"pp*virtual_stages={num_stages}"
            allowed = [p for p in range(1, m.n_layer + 1) if m.n_layer % p == 0]
            problems.append(
                f"model.n_layer={m.n_layer}: not divisible by {where}; stages must divide "
                f"n_layer ({allowed}) or set pipeline.layers_per_stage"
            )
            return []
        counts = [m.n_layer // num_stages] * num_stages
    starts = [sum(counts[:i]) for i in range(num_stages)]
    return [[s, s + c] for s, c in zip(starts, counts, strict=True)]


def stage_to_pp_rank(stage: int, pp: int, v_shaped: bool) -> int:
    """Where torch.distributed.pipelining places a stage: loop (stage % pp) or V."""
    if not v_shaped:
        return stage % pp
    return stage if stage < pp else 2 * pp - 1 - stage


def pipeline_layout(
    cfg: DtrainConfig, batch: BatchPlan, problems: list[str]
) -> PipelinePlan | None:
    par, pipe, m = cfg.parallel, cfg.pipeline, cfg.model
    if par.pp <= 1:
        return None
    name, v, pp = pipe.schedule, pipe.virtual_stages, par.pp
    if name in SINGLE_STAGE and v != 1:
        problems.append(
            f"pipeline.virtual_stages={v}: schedule {name} runs one stage per "
            f"rank; use 1 or an interleaved schedule (interleaved_1f1b, ...)"
        )
    if name in V_SHAPED and v != 2:
        problems.append(f"pipeline.virtual_stages={v}: schedule {name} needs exactly 2")
    num_stages = pp * v
    m_count = pipe.microbatches or batch.grad_accum
    if batch.grad_accum % m_count and not any(
        p.startswith(f"pipeline.microbatches={m_count}:") for p in problems
    ):  # the batch split already said why
        problems.append(
            f"pipeline.microbatches={m_count}: must divide the {batch.grad_accum} micro-batches "
            f"each rank runs per step (global_batch / (micro_batch_size*dp))"
        )
    needs = {"1f1b": pp, "dualpipev": num_stages}.get(name)
    if needs and m_count < needs:
        problems.append(
            f"pipeline.microbatches={m_count}: schedule {name} needs >= {needs}; lower "
            f"train.micro_batch_size or raise train.global_batch_size"
        )
    if name in ("interleaved_1f1b", "interleaved_zb"):
        rounds = max(1, m_count // pp)
        if m_count % rounds:
            problems.append(
                f"pipeline.microbatches={m_count}: schedule {name} needs a "
                f"multiple of {rounds} (rounds of pp={pp})"
            )
    ranges = stage_layers(m, num_stages, pipe.layers_per_stage, pp, problems)
    bubble = (pp - 1) / (v * m_count + pp - 1)
    stages = []
    d, b = m.n_embd, int(m.bias)
    per_layer = params_per_layer(m)
    act_layer = activation_bytes_per_layer(cfg, batch.micro_batch_size)
    for i, (lo, hi) in enumerate(ranges):
        first, last = i == 0, i == num_stages - 1
        params = (hi - lo) * per_layer
        params += (m.vocab_size + m.block_size) * d if first else 0
        params += m.vocab_size * d + d * (1 + b) if last else 0
        act = int(act_layer * (hi - lo))
        stages.append(
            StagePlan(
                i, stage_to_pp_rank(i, pp, name in V_SHAPED), [lo, hi], first, last, params, act
            )
        )
    return PipelinePlan(
        name, num_stages, v, m_count, batch.grad_accum // max(m_count, 1), bubble, stages
    )


def bubble_warning(pipe: PipelinePlan, pp: int) -> str | None:
    if pipe.bubble <= BUBBLE_WARN:
        return None
    need = math.ceil(3 * (pp - 1) / pipe.virtual_stages - 1e-9)  # (p-1)/(v m+p-1) <= 1/4
    return (
        f"pipeline bubble {pipe.bubble:.0%} > {BUBBLE_WARN:.0%} with {pipe.microbatches} "
        f"micro-batches; use >= {need} (pipeline.microbatches, a smaller "
        f"train.micro_batch_size or a larger global batch) to bring it under"
    )


def strategy_problems(cfg: DtrainConfig, problems: list[str], warnings: list[str]) -> None:
    """Combinations of strategy, compression, sync mode and model that do not go together."""
    par, m = cfg.parallel, cfg.model
    strategy, comp, sync = par.strategy, cfg.comm.compression, cfg.sync.mode
    if strategy != "fsdp" and (par.cpu_offload or not par.reshard_after_forward):
        key = (
            "parallel.cpu_offload=true"
            if par.cpu_offload
            else "parallel.reshard_after_forward=false"
        )
        problems.append(
            f"{key}: an fsdp option, but parallel.strategy={strategy}; "
            f"set parallel.strategy=fsdp or drop it"
        )
    split = (
        cfg.pipeline.schedule if par.pp > 1 and cfg.pipeline.schedule in SPLIT_BACKWARD else None
    )
    if strategy == "fsdp" and split and par.reshard_after_forward:
        warnings.append(
            f"parallel.reshard_after_forward=true: not under pipeline.schedule={split}, "
            f"whose weight pass needs each stage's gathered parameters: they stay gathered "
            f"from forward to backward (ZeRO-2)"
        )
    if comp != "none" and (strategy == "fsdp" or par.tp > 1 or split):
        problems.append(
            f"comm.compression={comp}: DDP communication hooks apply to strategy ddp/zero1 "
            f"without tp or a zero-bubble schedule; this run uses strategy={strategy}, "
            f"tp={par.tp}" + (f", pipeline.schedule={split}" if split else "")
        )
    if strategy == "zero1" and par.tp > 1:
        problems.append(
            "parallel.strategy=zero1: ZeroRedundancyOptimizer does not take "
            "tensor-parallel (DTensor) parameters; use parallel.strategy=fsdp with tp"
        )
    elif strategy == "zero1" and split and par.dp > 1:
        problems.append(
            f"parallel.strategy=zero1: pipeline.schedule={split} computes weight gradients "
            f"outside DDP's hooks; use parallel.strategy=fsdp or one of the schedules "
            + ", ".join(s for s in SCHEDULES if s not in SPLIT_BACKWARD)
        )
    if sync == "local_sgd":
        if par.pp > 1 or par.tp > 1 or strategy != "ddp":
            problems.append(
                f"sync.mode=local_sgd: needs strategy=ddp with tp=1 and pp=1 "
                f"(got strategy={strategy}, tp={par.tp}, pp={par.pp})"
            )
        if comp != "none":
            problems.append(
                f"comm.compression={comp}: local SGD does not all-reduce "
                f"gradients after warm-up; use comm.compression=none"
            )
        if cfg.sync.warmup_steps > cfg.train.steps:
            problems.append(
                f"sync.warmup_steps={cfg.sync.warmup_steps}: longer than training "
                f"(train.steps={cfg.train.steps})"
            )
    if m.arch == "cnn_bn":
        if par.tp > 1 or par.pp > 1:
            problems.append(f"model.arch=cnn_bn: data parallel only (got tp={par.tp}, pp={par.pp})")
        if cfg.data.source != "shapes":
            problems.append(
                f"data.source={cfg.data.source}: model.arch=cnn_bn trains on "
                f"images; use data=shapes"
            )
    elif cfg.data.source == "shapes":
        problems.append("data.source=shapes: images need model.arch=cnn_bn (e.g. recipe=cnn_bn)")
    if m.sync_bn and m.arch != "cnn_bn":
        warnings.append(
            f"model.sync_bn=true: model.arch={m.arch} has no BatchNorm; nothing to synchronize"
        )
