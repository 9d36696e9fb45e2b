"""``dtrain advise``: every layout the plan accepts for a model on some hardware, ranked by
estimated throughput. Pure, torch-free for the built-in models.

    dtrain advise recipe=gpt_small hardware=cpu --top 5
    dtrain advise recipe=gpt_small hardware=h100_80g parallel.nnodes=8 --json

Each candidate (dp x tp x pp, strategy, pipeline schedule and virtual stages, micro-batch
size, activation checkpointing) is a config handed to :func:`.build.build_plan`, the same
code ``dtrain plan`` runs: its problems reject the candidate (heads not divisible by tp,
layers by stages, a batch no micro-batch divides ...). What the plan accepts is costed by
:mod:`.steptime` (memory at the peak, bytes per link, step time) and rejected if it does
not fit, if tp crosses nodes (unless allowed) or if the bubble exceeds
:data:`MAX_BUBBLE`. The rest is ranked by tokens (or samples) per second; ties go to the
simpler layout (ddp < zero1 < fsdp, no tp or pp, less checkpointing), then to the larger
micro-batch (the estimate has no term for kernel efficiency, which only grows with it).
"""

from __future__ import annotations

import dataclasses

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.errors import ConfigError
from dtrain_cli.mesh.schedules import V_SHAPED
from dtrain_cli.models import model_spec
from dtrain_cli.plan.advice import Advice, Layout, Verdict
from dtrain_cli.plan.build import Resources, build_plan
from dtrain_cli.plan.layout import balanced_split
from dtrain_cli.plan.steptime import GIB, estimate_step
from dtrain_cli.strategies import names, strategy_for

MAX_BUBBLE = 0.5
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2), ("zbv", 2))
CHECKPOINTING = ("none", "selective", "full")
MAX_MICRO_CHOICES = 6


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(
    cfg: DtrainConfig, world: int, dp_max: int | None = None, tp_max: int | None = None
) -> list[Layout]:
    """Every (dp, tp, pp) using all ``world`` devices and each choice on top of it."""
    gb = cfg.train.global_batch_size or 0
    layers = _layer_count(cfg)
    out = []
    for tp in divisors(world):
        if tp_max is not None and tp > tp_max:
            continue
        for pp in divisors(world // tp):
            dp = world // (tp * pp)
            if dp_max is not None and dp > dp_max:
                continue
            share = gb // dp if gb and gb % dp == 0 else 0
            micros = [m for m in divisors(share) if m & (m - 1) == 0 or m == share]
            if len(micros) > MAX_MICRO_CHOICES:  # the smallest (memory, pipeline micro-
                half = MAX_MICRO_CHOICES // 2  # batches) and the largest (fewer steps)
                micros = micros[:half] + micros[-half:]
            strategies = names() if dp > 1 else names()[:1]  # the registry, simplest first
            schedules = SCHEDULES if pp > 1 else ((None, 1),)
            for strategy in strategies:
                for sched, v in schedules:
                    for micro in micros or [1]:
                        for ac in CHECKPOINTING:
                            out.append(
                                Layout(
                                    dp=dp,
                                    tp=tp,
                                    pp=pp,
                                    strategy=strategy,
                                    micro_batch_size=micro,
                                    activation_checkpointing=ac,
                                    schedule=sched,
                                    virtual_stages=v,
                                    layers_per_stage=uneven(layers, pp, sched, v),
                                )
                            )
    return out


def _layer_count(cfg: DtrainConfig) -> int | None:
    try:
        spec = model_spec(cfg)
        return spec.facts().num_layers if spec.pipeline_splittable() else None
    except Exception:  # the plan of each layout says why the model cannot be built
        return None


def uneven(layers: int | None, pp: int, schedule: str | None, v: int) -> tuple[int, ...] | None:
    """The split of a pipeline whose stages the layers do not divide evenly."""
    if layers is None or pp <= 1:
        return None
    split = balanced_split(layers, pp, v, schedule in V_SHAPED)
    return tuple(split) if split else None


def layout_config(cfg: DtrainConfig, lay: Layout, nnodes: int) -> DtrainConfig:
    par = dataclasses.replace(
        cfg.parallel,
        dp=lay.dp,
        tp=lay.tp,
        pp=lay.pp,
        strategy=lay.strategy,
        activation_checkpointing=lay.activation_checkpointing,
        nnodes=nnodes,
        nproc_per_node=None,
    )
    pipe = dataclasses.replace(
        cfg.pipeline,
        schedule=lay.schedule or cfg.pipeline.schedule,
        virtual_stages=lay.virtual_stages,
        microbatches=None,
        layers_per_stage=list(lay.layers_per_stage) if lay.layers_per_stage else None,
    )
    train = dataclasses.replace(cfg.train, micro_batch_size=lay.micro_batch_size, grad_accum=None)
    return dataclasses.replace(cfg, parallel=par, pipeline=pipe, train=train)


def world_of(cfg: DtrainConfig, world: int | None) -> tuple[int, int]:
    """(devices, nodes): ``world`` if given, else nnodes x devices per node."""
    g = max(cfg.hardware.devices_per_node, 1)
    if world is None:
        return max(cfg.parallel.nnodes, 1) * g, max(cfg.parallel.nnodes, 1)
    return world, max(1, world // g) if world % g == 0 else 1


def assess(
    cfg: DtrainConfig, lay: Layout, nnodes: int, allow_cross_node_tp: bool = False
) -> Verdict:
    hw = cfg.hardware
    g = max(hw.devices_per_node, 1)
    if lay.tp > 1 and (lay.tp > g or g % lay.tp) and not allow_cross_node_tp:
        return Verdict(
            layout=lay,
            rejected=f"tp={lay.tp} crosses nodes ({g} devices per node): tensor-parallel "
            f"all-reduces every layer would go over the {hw.inter_node_gbps:g} GB/s "
            "inter-node link",
            kind="cross-node tp",
        )
    c = layout_config(cfg, lay, nnodes)
    gpus = hw.devices_per_node if hw.device == "cuda" else 0
    per_node = lay.dp * lay.tp * lay.pp // nnodes
    res = Resources(num_gpus=max(gpus, per_node if gpus else 0), num_cpus=max(per_node, 1))
    try:
        plan = build_plan(c, res)
    except ConfigError as exc:
        return Verdict(layout=lay, rejected=exc.problems[0], kind="plan")
    est = estimate_step(c, model_spec(c), plan, hw)
    v = Verdict(layout=lay, estimate=est)
    m = est.memory
    if not m.fits:
        v.rejected, v.kind = (
            f"does not fit: {m.total / GIB:.2f} GiB per device of {m.capacity / GIB:.2f} GiB "
            f"(short {(m.total - m.capacity) / GIB:.2f} GiB)",
            "memory",
        )
    elif est.bubble > MAX_BUBBLE:
        v.rejected, v.kind = (
            f"pipeline bubble {est.bubble:.0%} > {MAX_BUBBLE:.0%} with "
            f"{plan.pipeline.microbatches if plan.pipeline else 0} micro-batches",
            "bubble",
        )
    return v


def advise(
    cfg: DtrainConfig,
    world: int | None = None,
    dp_max: int | None = None,
    allow_cross_node_tp: bool = False,
    reference: Layout | None = None,
) -> Advice:
    """Rank every layout; raises ConfigError when none fits (saying what is short).
    ``reference``: a layout to cost too and compare #1 against (``Advice.reference_why``)."""
    if not cfg.train.global_batch_size:
        raise ConfigError(
            [
                "train.global_batch_size: not set; the advisor splits a global batch over layouts "
                "(set e.g. train.global_batch_size=256)"
            ]
        )
    devices, nnodes = world_of(cfg, world)
    verdicts = []
    refused: dict[Layout, str] = {}  # the plan's reason for a layout, whatever its checkpointing
    for lay in candidates(cfg, devices, dp_max):
        key = dataclasses.replace(lay, activation_checkpointing="none")
        if key in refused:  # checkpointing only adds a problem (no blocks), never removes one
            verdicts.append(Verdict(layout=lay, rejected=refused[key], kind="plan"))
            continue
        v = assess(cfg, lay, nnodes, allow_cross_node_tp)
        if v.kind == "plan" and lay == key:
            refused[key] = v.rejected or ""
        verdicts.append(v)
    ranked = [v for v in verdicts if v.rejected is None]
    rejected = [v for v in verdicts if v.rejected is not None]
    ranked.sort(
        key=lambda v: (
            -round(v.estimate.tokens_per_s, 6),
            v.layout.simplicity(),
            -v.layout.micro_batch_size,  # equal estimates: fewer, larger kernels
        )
    )
    spec = model_spec(cfg)
    advice = Advice(
        hardware=cfg.hardware.name,
        world_size=devices,
        nnodes=nnodes,
        unit=spec.facts().unit,
        ranked=ranked,
        rejected=rejected,
        activations_estimated=spec.activations_estimated(),
    )
    if not ranked:
        raise ConfigError([nothing_fits(cfg, advice, verdicts)])
    explain(advice)
    if reference is not None:
        from dtrain_cli.plan.advise_compare import compare_reference

        same = next((v for v in verdicts if v.layout == reference), None)
        advice.reference = same or assess(cfg, reference, nnodes, allow_cross_node_tp)
        advice.reference_why = compare_reference(advice, advice.reference)
    return advice


def nothing_fits(cfg: DtrainConfig, advice: Advice, verdicts: list[Verdict]) -> str:
    where = f"{advice.world_size} x {advice.hardware}"
    memory = [v for v in verdicts if v.kind == "memory"]
    if memory:
        best = min(memory, key=lambda v: v.estimate.memory.total)
        m = best.estimate.memory
        short = (m.total - m.capacity) / GIB
        # sharded state scales ~1/devices, the rest does not: the next power of two (5x did
        # not fit, nor divide a global batch of 32)
        more = 1 << (max(2, -(-m.total // max(m.capacity, 1))) - 1).bit_length()
        return (
            f"no layout fits {where}: the smallest ({best.layout.label()}) needs "
            f"{m.total / GIB:.2f} GiB per device of {m.capacity / GIB:.2f} GiB, short "
            f"{short:.2f} GiB; try about {more}x the devices (parallel.nnodes="
            f"{advice.nnodes * more}), a smaller train.global_batch_size or model"
            + (
                ""
                if best.layout.activation_checkpointing == "full"
                else ", activation checkpointing"
            )
            + ("" if strategy_for(best.layout.strategy).shards_params else f", {_sharding()}")
        )
    first: dict[tuple[int, int, int], str] = {}  # each (dp, tp, pp) with its first reason
    for v in verdicts:
        key = (v.layout.dp, v.layout.tp, v.layout.pp)
        first.setdefault(key, f"dp={key[0]} tp={key[1]} pp={key[2]}: {v.rejected}")
    return f"no layout fits {where}: " + "; ".join(list(first.values())[:4])


def explain(advice: Advice) -> None:
    """One line per ranked layout: what its step is made of and, below #1, what it loses."""
    best = advice.ranked[0]
    pure_dp = [v for v in advice.ranked if v.layout.tp == 1 and v.layout.pp == 1]
    short = {v.layout: v for v in advice.rejected if v.kind == "memory"}
    for i, v in enumerate(advice.ranked):
        est, lay = v.estimate, v.layout
        shares = {k: s for k, s in est.shares().items() if s >= 0.005}
        top = ", ".join(f"{k} {s:.0%}" for k, s in sorted(shares.items(), key=lambda kv: -kv[1]))
        spare = (est.memory.capacity - est.memory.total) / GIB
        head = (
            "fastest"
            if i == 0
            else f"{1 - est.tokens_per_s / best.estimate.tokens_per_s:.0%} slower"
        )
        bits = [f"{head}: {top}", f"{spare:.1f} GiB spare"]
        if lay.tp == 1 and lay.pp == 1 and lay.dp > 1:
            bits.append("data parallel only: no model-parallel traffic")
        elif not pure_dp and lay.pp == 1:
            bits.append("model split within a node (no pure dp layout fits)")
        if lay.activation_checkpointing != "none":
            bits.append(
                f"recomputes {est.recompute_s / max(est.compute_s, 1e-30):.0%} more compute"
            )
            if plain := short.get(dataclasses.replace(lay, activation_checkpointing="none")):
                bits.append(f"needed: without it {plain.estimate.memory.total / GIB:.1f} GiB")
        plain = names()[0]  # the simplest strategy (replicated)
        if lay.strategy != plain and (alone := short.get(dataclasses.replace(lay, strategy=plain))):
            bits.append(f"{plain} would need {alone.estimate.memory.total / GIB:.1f} GiB")
        v.why = "; ".join(bits)


def _sharding() -> str:
    """The first registered strategy that shards the parameters, as an override."""
    return f"parallel.strategy={next(n for n in names() if strategy_for(n).shards_params)}"
