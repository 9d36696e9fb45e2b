"""Derive a :class:`Plan` from a typed config and the machine's resources. Pure, torch-free.

    dtrain plan recipe=gpt_small dp=4 pp=2

:func:`build_plan` runs one named job after the other: the values (ranges, choices), the
model's own checks, the device, the world arithmetic, the layout (strategy, sync mode,
batch split, pipeline), the script, the LR schedule, the checkpoint steps, the estimates,
the elastic sizes. Each job returns its problems; every problem found is raised together
as one :class:`ConfigError`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from dtrain_cli.config.data_warnings import data_warnings
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.suggest import not_allowed
from dtrain_cli.config.validate import config_problems
from dtrain_cli.errors import ConfigError
from dtrain_cli.mesh.dims import MESH_DIM_NAMES, ParallelDims
from dtrain_cli.models import ModelFacts, ModelSpec, UnknownModelKind, model_spec
from dtrain_cli.plan.fit import device_problems, threads_per_process
from dtrain_cli.plan.layout import (
    batch_layout,
    batchnorm_warning,
    bubble_warning,
    pipeline_layout,
    strategy_problems,
    tp_span_warning,
)
from dtrain_cli.plan.memory import comm_bytes_per_step, estimate
from dtrain_cli.plan.plan import (
    BatchPlan,
    CheckpointPlan,
    LRPlan,
    MeshPlan,
    PipelinePlan,
    Plan,
    PrecisionPlan,
    ScriptPlan,
)
from dtrain_cli.plan.resume import restart_warning
from dtrain_cli.plan.script import ScriptSpec, is_script, script_plan
from dtrain_cli.plan.script_checks import script_warnings
from dtrain_cli.plan.sync import num_servers, sync_plan
from dtrain_cli.strategies import names as strategy_names
from dtrain_cli.strategies import strategy_for
from dtrain_cli.sync_modes import mode_for
from dtrain_cli.sync_modes import names as mode_names

MAX_SAVES = 100_000
AUTOCAST_DTYPE = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What this node has; read without importing torch."""

    num_gpus: int
    num_cpus: int
    omp_threads: int | None = None
    """This shell's ``OMP_NUM_THREADS`` (a local launch keeps it, as torchrun does)."""

    @classmethod
    def detect(cls) -> Resources:
        omp = os.environ.get("OMP_NUM_THREADS", "").strip()
        return cls(
            num_gpus=visible_gpu_count(),
            num_cpus=len(os.sched_getaffinity(0)),
            omp_threads=int(omp) if omp.isdigit() and int(omp) > 0 else None,
        )


def node_of(cfg: DtrainConfig) -> Resources:
    """A node of the hardware the config plans for (``hardware.devices_per_node`` GPUs when
    ``hardware.device=cuda`` and ``run.device`` allows it): what ``dtrain simulate`` plans
    against, so a CUDA plan is simulated as the cluster would run it, not as this machine."""
    hw = cfg.hardware
    gpus = hw.devices_per_node if hw.device == "cuda" and cfg.run.device != "cpu" else 0
    return Resources(num_gpus=gpus, num_cpus=len(os.sched_getaffinity(0)))


def nodes_needed(cfg: DtrainConfig) -> int | None:
    """``dtrain simulate`` of a CUDA plan that names no node count: the nodes of
    ``hardware.devices_per_node`` GPUs its world needs (``dp=64 tp=8 pp=2`` on 8-GPU nodes:
    128); None when one node holds it, the world does not divide, or the config says."""
    par, g = cfg.parallel, node_of(cfg).num_gpus
    world = par.dp * par.tp * par.pp
    if not g or par.nnodes != 1 or par.nproc_per_node is not None or world <= g or world % g:
        return None
    return world // g


def visible_gpu_count() -> int:
    """NVIDIA GPUs the driver lists, narrowed by CUDA_VISIBLE_DEVICES (no CUDA init)."""
    gpus_dir = Path("/proc/driver/nvidia/gpus")
    total = len(list(gpus_dir.iterdir())) if gpus_dir.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return total
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(total, len(ids))


@dataclass(frozen=True, kw_only=True)
class World:
    """The processes of a layout: their number, the nodes, processes per node."""

    size: int
    nnodes: int
    nproc_per_node: int
    device: str
    backend: str


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What the layout jobs found: the batch split, the pipeline, the script."""

    batch: BatchPlan
    pipeline: PipelinePlan | None
    script: ScriptPlan | None
    warnings: list[str]


def build_plan(
    cfg: DtrainConfig, resources: Resources | None = None, workdir: Path | None = None
) -> Plan:
    """``workdir``: where a script's relative path resolves (default: the current dir)."""
    res = resources or Resources.detect()
    # every value in range, every name registered, before any arithmetic uses them
    if problems := config_problems(cfg) + registry_problems(cfg):
        raise ConfigError(problems)
    spec = model_of(cfg)
    world, problems = world_of(cfg, res)
    problems += spec.problems(cfg) + loss_problems(cfg, spec)  # the model's own checks
    facts = facts_of(spec, problems)
    layout, more = layout_of(cfg, spec, facts, world, workdir)
    problems += more
    if problems:
        raise ConfigError(problems)
    lr, lr_warnings = lr_plan(cfg, layout.batch)
    strategy = strategy_for(cfg.parallel.strategy)
    dp_replicate = strategy.dp_replicate(cfg, world.nproc_per_node)
    dims = ParallelDims(
        pp=cfg.parallel.pp, dp=cfg.parallel.dp, tp=cfg.parallel.tp, dp_replicate=dp_replicate
    )
    # another interpreter cannot be forked from this one: a fresh process per rank
    fresh = layout.script is not None and layout.script.python is not None
    threads, oversubscribed = threads_per_process(
        cfg, res.num_cpus, res.omp_threads, world.nproc_per_node
    )
    plan = Plan(
        recipe=cfg.run.recipe,
        model=spec.name,
        world_size=world.size,
        nnodes=world.nnodes,
        nproc_per_node=world.nproc_per_node,
        device=world.device,
        backend=world.backend,
        threads_per_proc=threads,
        start_method="spawn" if fresh else cfg.launcher.start_method,
        max_restarts=cfg.launcher.max_restarts,
        mesh=MeshPlan(
            dim_names=list(MESH_DIM_NAMES), shape=dims.shape(), dp_replicate=dp_replicate
        ),
        batch=layout.batch,
        lr=lr,
        precision=PrecisionPlan(
            name=cfg.precision.name,
            autocast_dtype=AUTOCAST_DTYPE[cfg.precision.name],
            loss_scaling=cfg.precision.name == "fp16",
        ),
        checkpoint=checkpoint_plan(cfg),
        estimates=estimate(cfg, spec, layout.batch, layout.pipeline, dims),
        steps=cfg.train.steps,
        strategy=strategy.name,
        pipeline=layout.pipeline,
        warnings=layout.warnings + lr_warnings + oversubscribed,
        loss=spec.default_loss() if cfg.train.loss == "auto" else cfg.train.loss,
        script=layout.script,
        sync=sync_plan(cfg, facts, comm_bytes_per_step(cfg, facts, ddp=True)),
    )
    plan.estimates.activations_estimated = spec.activations_estimated()
    if w := restart_warning(cfg):
        plan.warnings.append(w)
    if cfg.parallel.min_nnodes is not None and cfg.parallel.min_nnodes < world.nnodes:
        add_elastic(cfg, plan, res)
    return plan


def registry_problems(cfg: DtrainConfig) -> list[str]:
    """``parallel.strategy`` and ``sync.mode`` name registered entries
    (:mod:`dtrain_cli.strategies`, :mod:`dtrain_cli.sync_modes`)."""
    problems = []
    for key, value, choices in (
        ("parallel.strategy", cfg.parallel.strategy, strategy_names()),
        ("sync.mode", cfg.sync.mode, mode_names()),
    ):
        if value not in choices:
            problems.append(not_allowed(key, value, choices))
    return problems


def model_of(cfg: DtrainConfig) -> ModelSpec:
    """The model's spec (your own script: a stand-in), its own value ranges checked."""
    try:
        spec = ScriptSpec(None, cfg) if is_script(cfg) else model_spec(cfg)
    except UnknownModelKind as exc:
        raise ConfigError([str(exc)]) from None
    if problems := spec.value_problems():  # the model's own ranges, like the others above
        raise ConfigError(problems)
    return spec


def facts_of(spec: ModelSpec, problems: list[str]) -> ModelFacts:
    try:
        return spec.facts()
    except ValueError:  # a model that cannot be built: its problems() said why
        raise ConfigError(problems) from None


def world_of(cfg: DtrainConfig, res: Resources) -> tuple[World, list[str]]:
    """dp*tp*pp (+ a sync mode's own processes) over the nodes, on which device."""
    par, problems = cfg.parallel, []
    device = cfg.run.device
    if device == "auto":
        device = "cuda" if res.num_gpus > 0 else "cpu"
    servers = num_servers(cfg)
    world = par.dp * par.tp * par.pp + servers  # servers: ranks after the mesh
    nnodes = max(par.nnodes, 1)
    nproc = par.nproc_per_node
    if nproc is None:
        nproc = world // nnodes if world % nnodes == 0 else 0
        if nproc == 0:
            given = f"{par.min_nnodes}:{nnodes}" if par.min_nnodes else str(nnodes)
            problems.append(
                f"parallel.nnodes={given}: dp*tp*pp = {world} processes do not split evenly "
                f"over {nnodes} nodes; make dp*tp*pp a multiple of nnodes"
            )
    elif nproc * nnodes != world and world > 0 and not servers:  # the sync mode says it
        problems.append(
            f"dp*tp*pp = {par.dp}*{par.tp}*{par.pp} = {world} but nproc_per_node*nnodes = "
            f"{nproc}*{nnodes} = {nproc * nnodes} processes were asked for; "
            + _world_fix(par.dp, par.tp * par.pp, nproc * nnodes, nnodes)
        )
    problems += device_problems(cfg, device, nproc, res.num_gpus)
    backend = "nccl" if device == "cuda" else "gloo"
    out = World(size=world, nnodes=nnodes, nproc_per_node=nproc, device=device, backend=backend)
    return out, problems


def _world_fix(dp: int, model_parallel: int, nproc_total: int, nnodes: int) -> str:
    """What to set so that dp*tp*pp equals the processes asked for: only valid values."""
    fixes = []
    if nproc_total % model_parallel == 0:
        fixes.append(f"dp={nproc_total // model_parallel}")
    world = dp * model_parallel
    if world % nnodes == 0:
        fixes.append(f"nproc_per_node={world // nnodes}")
    return "set " + " or ".join(fixes) if fixes else "make them equal"


def loss_problems(cfg: DtrainConfig, spec: ModelSpec) -> list[str]:
    """``train.loss``: a dotted path must resolve (outside the standard library) to a
    callable; ``model`` cannot run on pipeline stages unless the model's spec computes it."""
    loss = cfg.train.loss
    if loss == "model" and cfg.parallel.pp > 1 and spec.default_loss() != "model":
        return [
            "train.loss=model: with pp > 1 the last stage returns outputs, not a loss; "
            "use train.loss=cross_entropy, mse or a callable"
        ]
    if "." not in loss:
        return []
    from dtrain_cli.targets import TargetError, resolve_target

    try:
        fn = resolve_target(loss, key="train.loss", roots=cfg.run.import_roots)
    except TargetError as exc:
        return [str(exc)]
    return [] if callable(fn) else [f"train.loss={loss}: not callable"]


def layout_of(
    cfg: DtrainConfig, spec: ModelSpec, facts: ModelFacts, world: World, workdir: Path | None
) -> tuple[Layout, list[str]]:
    """The strategy and the sync mode with this layout, the batch split, the pipeline, the
    script; their problems and warnings."""
    par = cfg.parallel
    problems, warnings = strategy_problems(cfg)
    mode = mode_for(cfg.sync.mode)
    problems += mode.problems(cfg, world.device)
    if strategy_for(par.strategy).shards_params:
        problems += spec.sharding_problems(cfg)
    warnings = data_warnings(cfg.data, spec) + spec.warnings(cfg) + warnings + mode.warnings(cfg)
    if par.activation_checkpointing in ("selective", "full") and not facts.num_layers:
        problems.append(
            f"parallel.activation_checkpointing={par.activation_checkpointing}: "
            f"model.kind={spec.kind} has no repeated blocks to checkpoint; use none"
        )
    batch, batch_problems = batch_layout(cfg, facts)
    pipeline, pipe_problems = (None, [])
    if not is_script(cfg):
        pipeline, pipe_problems = pipeline_layout(cfg, spec, batch, batch_ok=not batch_problems)
    script, script_problems = script_plan(cfg, workdir)
    problems += batch_problems + pipe_problems + script_problems + mode.model_problems(cfg, facts)
    if pipeline is not None and (w := bubble_warning(pipeline, par.pp)):
        warnings.append(w)
    if script is None and (w := batchnorm_warning(cfg, facts, batch)):
        warnings.append(w)
    if w := tp_span_warning(par.tp, world.nnodes, world.nproc_per_node):
        warnings.append(w)
    if script is not None:
        warnings += script_warnings(script, world.size, world.device)
    return Layout(batch=batch, pipeline=pipeline, script=script, warnings=warnings), problems


def lr_plan(cfg: DtrainConfig, batch: BatchPlan) -> tuple[LRPlan, list[str]]:
    """The LR scaled to the global batch (``optim.lr_scaling``), warmup and decay."""
    opt, steps = cfg.optim, cfg.train.steps
    base_batch = opt.base_batch_size or batch.global_batch_size
    ratio = batch.global_batch_size / base_batch
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[opt.lr_scaling]
    lr = LRPlan(
        base_lr=opt.base_lr,
        base_batch_size=base_batch,
        scaling=opt.lr_scaling,
        peak_lr=opt.base_lr * factor,
        warmup_steps=opt.warmup_steps,
        decay=opt.decay,
        min_lr=min(opt.min_lr, opt.base_lr * factor),
        steps=steps,
    )
    warnings = []
    if opt.warmup_steps > steps:  # a shortened try-out run: fine, the LR never peaks
        warnings.append(
            f"optim.warmup_steps={opt.warmup_steps} is longer than training "
            f"(train.steps={steps}): the LR stays in warmup and never reaches its peak"
        )
    if opt.min_lr > lr.peak_lr:
        warnings.append(f"optim.min_lr={opt.min_lr} is above the scaled peak lr; capped to it")
    return lr, warnings


def checkpoint_plan(cfg: DtrainConfig) -> CheckpointPlan:
    """The steps saved by count (every N, and the end); time-based saves come on top."""
    ck, steps = cfg.checkpoint, cfg.train.steps
    if ck.every_steps and steps // ck.every_steps > MAX_SAVES:
        raise ConfigError(
            [
                f"checkpoint.every_steps={ck.every_steps}: {steps // ck.every_steps:,} saves "
                f"in train.steps={steps}; use at least "
                f"{math.ceil(steps / MAX_SAVES)} (at most {MAX_SAVES:,} saves)"
            ]
        )
    save_steps = list(range(ck.every_steps, steps + 1, ck.every_steps)) if ck.every_steps else []
    if ck.at_end and steps not in save_steps:
        save_steps.append(steps)
    return CheckpointPlan(
        every_steps=ck.every_steps,
        every_minutes=ck.every_minutes,
        keep_last=ck.keep_last,
        at_end=ck.at_end,
        async_save=ck.async_save,
        steps=save_steps,
    )


def add_elastic(cfg: DtrainConfig, plan: Plan, res: Resources) -> None:
    """``parallel.nnodes=MIN:MAX``: the layout at every node count, and what to warn."""
    from dtrain_cli.plan.elastic import elastic_plan

    low, high = cfg.parallel.min_nnodes, plan.nnodes
    plan.elastic = elastic_plan(cfg, plan, lambda sub: build_plan(sub, res))
    if plan.max_restarts == 0:
        plan.warnings.append(
            f"parallel.nnodes={low}:{high} with launcher.max_restarts=0: a "
            "lost node ends the run (each loss uses one restart); set launcher.max_restarts"
        )
    if refused := [r["nnodes"] for r in plan.elastic.refused]:
        # the rendezvous admits any count in range (torch's min/max): a group of a
        # refused size starts, and its workers stop with the reason
        plan.warnings.append(
            f"parallel.nnodes={low}:{high}: {', '.join(map(str, refused))} "
            "node(s) cannot train this layout (see the elastic table); a group of that "
            "size fails at start-up with that reason (each try uses one restart)"
        )
