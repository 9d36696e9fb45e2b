"""Batch split and model-parallel layout of a plan: micro-batches, pipeline stages and
schedule constraints, activations per part. Pure; each function returns its result with
the problems it found (one line each)."""

from __future__ import annotations

import math

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.mesh.schedules import (
    SINGLE_STAGE,
    SPLIT_BACKWARD,
    V_SHAPED,
    default_virtual_stages,
)
from dtrain_cli.models.spec import ModelFacts, ModelSpec
from dtrain_cli.plan.plan import BatchPlan, PipelinePlan, StagePlan
from dtrain_cli.strategies import strategy_for

BUBBLE_WARN = 0.25
BYTES_PER_ACTIVATION = {"fp32": 4, "bf16": 2, "fp16": 2}


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 step``, ``2 steps``, ``1 process``, ``3 processes``."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def fsdp_reshards_after_forward(cfg: DtrainConfig, schedule: str | None) -> bool:
    """``parallel.reshard_after_forward``, except under a zero-bubble schedule: its weight
    pass takes the stage's registered parameters, which must still be the gathered ones."""
    return cfg.parallel.reshard_after_forward and schedule not in SPLIT_BACKWARD


def fsdp_gathers(
    cfg: DtrainConfig, grad_accum: int, pipeline: PipelinePlan | None
) -> tuple[int, int]:
    """(all-gathers of each FSDP unit per round, rounds per step), as FSDP2 runs them.
    Without a pipeline a round is a micro-batch: a gather in forward and, when resharded
    after forward, again in backward. In a pipeline a round is a schedule call: each
    micro-batch's forward gathers (resharded after it) and backward gathers once, since
    ``torch.distributed.pipelining`` keeps the parameters gathered between backwards
    (``set_reshard_after_backward(False)``): m + 1, every schedule; 1 unresharded."""
    schedule = pipeline.schedule if pipeline is not None else None
    reshard = fsdp_reshards_after_forward(cfg, schedule)
    if pipeline is None:
        return (2 if reshard else 1), max(grad_accum, 1)
    return (pipeline.microbatches + 1 if reshard else 1), max(pipeline.calls_per_step, 1)


def divisors(n: int, limit: int = 64) -> list[int]:
    """The divisors of ``n`` up to ``limit`` (suggestions stay short and cheap)."""
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is <= ``at_most`` (a default that always fits)."""
    return max(divisors(n, min(at_most, 1024)))


def default_microbatches(share: int, pp: int, stages: int) -> int:
    """Pipeline micro-batches for a rank's ``share`` of samples when none are set: the most
    up to two per stage that divide it, or, when those are fewer than ``pp`` (a 1F1B
    pipeline needs one per stage), the fewest that are not (a prime share of 5 at pp=2: 5
    of 1, not 1 of 5)."""
    most = largest_divisor(share, 2 * stages)
    enough = [d for d in divisors(share, 1024) if d >= pp]
    return most if most >= pp or not enough else min(enough)


def nearest_multiples(n: int, k: int) -> str:
    """' (15 or 18)': the multiples of ``k`` either side of ``n``, for an error message
    (nothing where ``n`` is below ``k``: the multiple is then the one named)."""
    below = n // k * k
    return f" ({below} or {below + k})" if below > 0 else ""


def batch_layout(cfg: DtrainConfig, facts: ModelFacts) -> tuple[BatchPlan, list[str]]:
    """global = micro * grad_accum * dp. An unset micro batch takes the whole per-rank share
    (no accumulation) or, with pp > 1, splits it into pipeline micro-batches."""
    tr, par = cfg.train, cfg.parallel
    problems: list[str] = []
    dp = max(par.dp, 1)
    micro, accum = tr.micro_batch_size, tr.grad_accum
    global_batch = tr.global_batch_size
    if global_batch is None:
        micro = micro or 8
        accum = accum or (cfg.pipeline.microbatches or 1 if par.pp > 1 else 1)
        global_batch = micro * accum * dp
    else:
        share = max(1, global_batch // dp)
        if micro is None:  # derived from values the user set: one message, on those
            if global_batch % dp:
                problems.append(
                    f"train.global_batch_size={global_batch}: not divisible by dp={dp}; "
                    f"use a multiple of {dp}{nearest_multiples(global_batch, dp)}"
                )
            wanted = 1
            if par.pp > 1:
                stages = par.pp * virtual_stages(cfg)
                wanted = cfg.pipeline.microbatches or default_microbatches(share, par.pp, stages)
                if share % wanted and not global_batch % dp:
                    least = {"1f1b": par.pp, "dualpipev": stages}.get(cfg.pipeline.schedule, 1)
                    fits = [d for d in divisors(share, max(16, share)) if d >= least][:12]
                    problems.append(
                        f"pipeline.microbatches={wanted}: must divide the {share} samples each "
                        f"dp rank runs per step (global_batch_size/dp); use one of {fits}"
                    )
            micro = max(1, share // wanted)
        per_step = micro * dp
        derived_wrong = tr.micro_batch_size is None and bool(problems)  # said once, above
        if global_batch % per_step and not derived_wrong:
            problems.append(
                f"train.global_batch_size={global_batch}: not divisible by micro_batch_size*dp "
                f"= {micro}*{dp} = {per_step}; use a multiple of {per_step}"
                f"{nearest_multiples(global_batch, per_step)}"
            )
        accum = max(1, global_batch // per_step)
    seq = facts.tokens_per_sample
    batch = BatchPlan(
        micro_batch_size=micro,
        grad_accum=accum,
        dp=dp,
        global_batch_size=global_batch,
        seq_len=seq,
        tokens_per_step=global_batch * seq,
        unit=facts.unit,
    )
    return batch, problems


def stage_layers(
    num_layers: int, num_stages: int, split: list[int] | None, pp: int, label: str = ""
) -> tuple[list[list[int]], list[str]]:
    """[first, last + 1) of the model's layers on each stage: even, or as given."""
    if split is not None:
        if len(split) != num_stages or sum(split) != num_layers or min(split) < 1:
            return [], [
                f"pipeline.layers_per_stage={split}: needs {num_stages} entries >= 1 "
                f"(pp*virtual_stages) summing to {label or num_layers}"
            ]
        counts = split
    else:
        if num_layers % num_stages or num_layers < num_stages:
            where = f"pp={pp}" if num_stages == pp else f"pp*virtual_stages={num_stages}"
            return [], [
                f"{label or num_layers}: not divisible by {where}; stages must divide it "
                f"({divisors(num_layers)}) or set pipeline.layers_per_stage"
            ]
        counts = [num_layers // num_stages] * num_stages
    starts = [sum(counts[:i]) for i in range(num_stages)]
    return [[s, s + c] for s, c in zip(starts, counts, strict=True)], []


def balanced_split(num_layers: int, pp: int, v: int, v_shaped: bool) -> list[int] | None:
    """Layers per stage (``pipeline.layers_per_stage``) that give every pp rank the same
    number of layers, or as near as the count allows, where no even split of the stages
    exists (92 layers on pp=4 x 2 virtual stages: 12, 12, 12, 12, 11, 11, 11, 11, each rank
    23, as Megatron-Core splits them); None where one does, or where a stage would be empty."""
    stages = pp * v
    if num_layers % stages == 0 or num_layers < stages:
        return None
    per_rank = [num_layers // pp + (r < num_layers % pp) for r in range(pp)]
    chunks = [[n // v + (k < n % v) for k in range(v)] for n in per_rank]
    return [chunks[stage_to_pp_rank(i, pp, v_shaped)].pop(0) for i in range(stages)]


def stage_to_pp_rank(stage: int, pp: int, v_shaped: bool) -> int:
    """Where torch.distributed.pipelining places a stage: loop (stage % pp) or V."""
    if not v_shaped:
        return stage % pp
    return stage if stage < pp else 2 * pp - 1 - stage


def pipeline_layout(
    cfg: DtrainConfig, spec: ModelSpec, batch: BatchPlan, batch_ok: bool = True
) -> tuple[PipelinePlan | None, list[str]]:
    """Stages and schedule; the micro-batch checks only when the batch split held (else
    they would be built on numbers the user never set)."""
    if cfg.parallel.pp <= 1:
        return None, []
    pipe = cfg.pipeline
    m_count = pipe.microbatches or batch.grad_accum
    problems = schedule_problems(cfg, batch, m_count, batch_ok)
    facts = spec.facts()
    if not spec.pipeline_splittable():  # the model's own problems() said why
        return None, problems
    pp, v = cfg.parallel.pp, virtual_stages(cfg)
    num_stages = pp * v
    label = spec.layers_label(facts.num_layers)
    ranges, more = stage_layers(facts.num_layers, num_stages, pipe.layers_per_stage, pp, label)
    stages = []
    for i, (lo, hi) in enumerate(ranges):
        first, last = i == 0, i == num_stages - 1
        params = (hi - lo) * facts.params_per_layer
        params += facts.params_first if first else 0
        params += facts.params_last if last else 0
        act, _ = part_activations(cfg, spec, batch.micro_batch_size, lo, hi, first, last)
        stages.append(
            StagePlan(
                stage=i,
                pp_rank=stage_to_pp_rank(i, pp, pipe.schedule in V_SHAPED),
                layers=[lo, hi],
                embeddings=first,
                head=last,
                params=params,
                activation_bytes=act,
            )
        )
    plan = PipelinePlan(
        schedule=pipe.schedule,
        num_stages=num_stages,
        virtual_stages=v,
        microbatches=m_count,
        calls_per_step=batch.grad_accum // max(m_count, 1),
        bubble=(pp - 1) / (v * m_count + pp - 1),
        stages=stages,
    )
    return plan, problems + more


def virtual_stages(cfg: DtrainConfig) -> int:
    """``pipeline.virtual_stages``, or the schedule's default where unset."""
    return cfg.pipeline.virtual_stages or default_virtual_stages(cfg.pipeline.schedule)


def schedule_problems(
    cfg: DtrainConfig, batch: BatchPlan, m_count: int, batch_ok: bool
) -> list[str]:
    """What the schedule needs of virtual stages and micro-batches."""
    name, v, pp = cfg.pipeline.schedule, virtual_stages(cfg), cfg.parallel.pp
    problems = []
    if name in SINGLE_STAGE and v != 1:
        problems.append(
            f"pipeline.virtual_stages={v}: schedule {name} runs one stage per "
            f"rank; use 1 or an interleaved schedule (interleaved_1f1b, ...)"
        )
    if name in V_SHAPED and v != 2:
        problems.append(f"pipeline.virtual_stages={v}: schedule {name} needs exactly 2")
    if not batch_ok:
        return problems
    if batch.grad_accum % m_count:
        problems.append(
            f"pipeline.microbatches={m_count}: must divide the {batch.grad_accum} micro-batches "
            f"each rank runs per step (global_batch / (micro_batch_size*dp))"
        )
    needs = {"1f1b": pp, "dualpipev": pp * v}.get(name)
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
    return problems


def checkpointed_layers(lo: int, hi: int, mode: str) -> list[int]:
    """Global indices of the blocks in [lo, hi) that ``parallel.activation_checkpointing``
    checkpoints: full = all; selective = every other one, the 2nd, 4th, ... of the model
    (torchtitan's layer-wise selective AC, frequency 2); none = none. The runtime
    (:mod:`dtrain_cli.runtime.parallel.activation_checkpoint`) applies exactly these."""
    if mode == "full":
        return list(range(lo, hi))
    if mode == "selective":
        return [i for i in range(lo, hi) if i % 2 == 1]
    return []


def part_activations(
    cfg: DtrainConfig,
    spec: ModelSpec,
    micro_batch: int,
    lo: int,
    hi: int,
    first: bool,
    last: bool,
) -> tuple[int, int]:
    """(kept for backward, recomputation peak) bytes of one micro-batch on a model part
    holding blocks [lo, hi), with what the first stage keeps outside the blocks if
    ``first`` (the embedding's input) and the rest outside them if ``last`` (the head and
    the loss): a checkpointed block keeps its input only, and recomputing one in backward
    brings one block's activations back for a while."""
    bpv, tp = BYTES_PER_ACTIVATION[cfg.precision.name], max(cfg.parallel.tp, 1)
    per_block, other = spec.activation_bytes(micro_batch, bpv, tp)
    if bpv < 4 and strategy_for(cfg.parallel.strategy).holds_replicas:  # fp32 parameters
        extra_block, extra_other = spec.autocast_extra_bytes(micro_batch, tp)
        per_block, other = per_block + extra_block, other + extra_other
    chosen = checkpointed_layers(lo, hi, cfg.parallel.activation_checkpointing)
    kept_block = min(per_block, spec.checkpoint_bytes(micro_batch, bpv, tp))
    kept = per_block * (hi - lo - len(chosen)) + kept_block * len(chosen)
    on_first = min(spec.first_stage_bytes(micro_batch), other)
    kept += (on_first if first else 0) + (other - on_first if last else 0)
    return int(kept), int(per_block if chosen else 0)


def inflight_microbatches(schedule: str, pp: int, v: int, m: int, pp_rank: int) -> float:
    """Micro-batches whose activations a pp rank holds at its peak, in units of the rank's
    whole share (all its stages) of one micro-batch. GPipe and looped BFS run every forward
    first (m); 1F1B holds pp - rank (Narayanan et al. 2021); interleaved 1F1B warms up
    (v-1)*pp + 2*(pp-rank-1) + 1 stage-chunks of 1/v each (Megatron's schedule); the
    V-shaped zero-bubble schedules keep 1F1B's peak (Qi et al. 2024)."""
    if schedule in ("gpipe", "looped_bfs"):
        return float(m)
    if schedule in ("interleaved_1f1b", "interleaved_zb"):
        return min(float(m), ((v - 1) * pp + 2 * (pp - pp_rank - 1) + 1) / v)
    if schedule in V_SHAPED:
        return float(min(m, pp))  # V placement: the rank's two chunks together as in 1F1B
    return float(min(m, pp - pp_rank))


def batchnorm_warning(cfg: DtrainConfig, facts: ModelFacts, batch: BatchPlan) -> str | None:
    """BatchNorm at dp > 1 normalizes each rank's slice unless synchronized; synchronizing
    a model without BatchNorm does nothing."""
    layers, sync = facts.batchnorm_layers, cfg.parallel.sync_batchnorm
    if layers and batch.dp > 1 and not sync:
        return (
            f"the model has {layers} BatchNorm layer{'s' * (layers > 1)} and dp={batch.dp}: "
            f"each rank normalizes over its own {batch.micro_batch_size} samples, so the run "
            f"differs from dp=1; parallel.sync_batchnorm=true uses the statistics of the "
            f"whole batch"
        )
    if sync and not layers:
        return "parallel.sync_batchnorm=true: the model has no BatchNorm layer to synchronize"
    if layers and batch.grad_accum > 1:  # statistics of each micro-batch, synced or not
        over = batch.micro_batch_size * (batch.dp if sync else 1)
        return (
            f"the model has {layers} BatchNorm layer{'s' * (layers > 1)} and "
            f"{batch.grad_accum} micro-batches a step: each normalizes over its own {over} "
            "samples, so the run differs from one without accumulation; a micro-batch of the "
            "whole per-rank batch (train.micro_batch_size) keeps it"
        )
    return None


def bubble_warning(pipe: PipelinePlan, pp: int) -> str | None:
    if pipe.bubble <= BUBBLE_WARN:
        return None
    need = math.ceil(3 * (pp - 1) / pipe.virtual_stages - 1e-9)  # (p-1)/(v m+p-1) <= 1/4
    return (
        f"pipeline bubble {pipe.bubble:.0%} > {BUBBLE_WARN:.0%} with {pipe.microbatches} "
        f"micro-batches; use >= {need} (pipeline.microbatches, a smaller "
        f"train.micro_batch_size or a larger global batch) to bring it under"
    )


def tp_span_warning(tp: int, nnodes: int, nproc_per_node: int) -> str | None:
    """Tensor parallelism all-reduces activations in every layer, forward and backward: its
    ranks (consecutive in the mesh, tp innermost) belong on one node's fast links (the
    Megatron-LM practice, and torchtitan's mesh order)."""
    if nnodes <= 1 or tp <= 1 or nproc_per_node % tp == 0:
        return None
    fit = largest_divisor(nproc_per_node, tp)
    return (
        f"tp={tp} spans nodes ({nproc_per_node} processes per node): every layer's "
        f"tensor-parallel all-reduces cross the network, far slower than inside a node; "
        f"make tp a divisor of the processes per node (tp={fit}, the rest to dp or pp)"
    )


def strategy_problems(cfg: DtrainConfig) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the strategy and the sync mode with this layout: each
    registry entry says what it cannot combine with (:mod:`dtrain_cli.strategies`,
    :mod:`dtrain_cli.sync_modes`)."""
    from dtrain_cli.strategies import strategy_for

    par = cfg.parallel
    split = (
        cfg.pipeline.schedule if par.pp > 1 and cfg.pipeline.schedule in SPLIT_BACKWARD else None
    )
    strategy = strategy_for(par.strategy)
    warnings = strategy.warnings(cfg, split)
    comm, steps = cfg.comm, cfg.train.steps
    exact = max(comm.powersgd_start_iter, 2)  # torch's PowerSGD hook: at least 2
    if comm.compression == "powersgd" and par.dp > 1 and steps <= exact:
        warnings.append(
            f"comm.compression=powersgd: its first {exact} steps are exact all-reduces "
            f"(comm.powersgd_start_iter={comm.powersgd_start_iter}) and train.steps={steps}: "
            "it never compresses; lower comm.powersgd_start_iter or train longer"
        )
    return strategy.problems(cfg, split), warnings
