"""Derive a :class:`Plan` from a typed config and the machine's resources. Pure, torch-free.

Every problem (bad values from :mod:`dtrain_cli.config.validate` and layout problems
found here) is collected and raised together as one :class:`ConfigError`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from dtrain_cli.config.errors import ConfigError
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.validate import config_problems
from dtrain_cli.models import ModelSpec, UnknownModelKind, model_spec
from dtrain_cli.plan.layout import (
    batch_layout,
    bubble_warning,
    pipeline_layout,
    plural,
    strategy_problems,
)
from dtrain_cli.plan.memory import comm_bytes_per_step, estimate
from dtrain_cli.plan.plan import (
    MESH_DIM_NAMES,
    CheckpointPlan,
    LRPlan,
    MeshPlan,
    Plan,
    PrecisionPlan,
)
from dtrain_cli.plan.script import ScriptSpec, is_script, script_plan
from dtrain_cli.plan.sync import num_servers, server_count_problems, sync_plan, sync_problems

MAX_SAVES = 100_000
AUTOCAST_DTYPE = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Resources:
    """What this node has; read without importing torch."""

    num_gpus: int
    num_cpus: int

    @classmethod
    def detect(cls) -> Resources:
        return cls(num_gpus=visible_gpu_count(), num_cpus=len(os.sched_getaffinity(0)))


def visible_gpu_count() -> int:
    """NVIDIA GPUs the driver lists, narrowed by CUDA_VISIBLE_DEVICES (no CUDA init)."""
    gpus_dir = Path("/proc/driver/nvidia/gpus")
    total = len(list(gpus_dir.iterdir())) if gpus_dir.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return total
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(total, len(ids))


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
    from dtrain_cli.config.targets import TargetError, resolve_target

    try:
        fn = resolve_target(loss, key="train.loss", roots=cfg.run.import_roots)
    except TargetError as exc:
        return [str(exc)]
    return [] if callable(fn) else [f"train.loss={loss}: not callable"]


def _world_fix(dp: int, model_parallel: int, nproc_total: int, nnodes: int) -> str:
    """What to set so that dp*tp*pp equals the processes asked for: only valid values."""
    fixes = []
    if nproc_total % model_parallel == 0:
        fixes.append(f"dp={nproc_total // model_parallel}")
    world = dp * model_parallel
    if world % nnodes == 0:
        fixes.append(f"nproc_per_node={world // nnodes}")
    return "set " + " or ".join(fixes) if fixes else "make them equal"


def build_plan(
    cfg: DtrainConfig, resources: Resources | None = None, workdir: Path | None = None
) -> Plan:
    """``workdir``: where a script's relative path resolves (default: the current dir)."""
    res = resources or Resources.detect()
    problems = config_problems(cfg)
    if problems:  # every value is in range before the layout's arithmetic uses it
        raise ConfigError(problems)
    par, tr = cfg.parallel, cfg.train
    script = is_script(cfg)  # your own training script: its model is its own
    try:
        spec = ScriptSpec(None, cfg) if script else model_spec(cfg)
    except UnknownModelKind as exc:
        raise ConfigError([*problems, str(exc)]) from None
    if problems := spec.value_problems():  # the model's own ranges, like the others above
        raise ConfigError(problems)

    device = cfg.run.device
    if device == "auto":
        device = "cuda" if res.num_gpus > 0 else "cpu"
    backend = "nccl" if device == "cuda" else "gloo"

    mesh_sizes = {"dp": par.dp, "tp": par.tp, "pp": par.pp}
    world = par.dp * par.tp * par.pp + num_servers(cfg)  # servers: ranks after the mesh
    nnodes = max(par.nnodes, 1)
    nproc = par.nproc_per_node
    if nproc is None:
        nproc = world // nnodes if world % nnodes == 0 else 0
        if nproc == 0:
            problems.append(
                f"parallel.nnodes={nnodes}: dp*tp*pp = {world} processes do not split evenly "
                f"over {nnodes} nodes; make dp*tp*pp a multiple of nnodes"
            )
    elif nproc * nnodes != world and world > 0 and not num_servers(cfg):  # sync.py says it
        problems.append(
            f"dp*tp*pp = {par.dp}*{par.tp}*{par.pp} = {world} but nproc_per_node*nnodes = "
            f"{nproc}*{nnodes} = {nproc * nnodes} processes were asked for; "
            + _world_fix(par.dp, par.tp * par.pp, nproc * nnodes, nnodes)
        )
    if device == "cuda" and nproc > res.num_gpus:
        problems.append(
            f"{plural(nproc, 'process', 'processes')} per node {'needs' if nproc == 1 else 'need'} "
            f"{plural(nproc, 'GPU')} but "
            f"{res.num_gpus} {'is' if res.num_gpus == 1 else 'are'} visible; "
            f"lower dp/tp/pp or set run.device=cpu"
        )
    if cfg.run.device == "cuda" and res.num_gpus == 0:
        problems.append("run.device=cuda: no GPU is visible here; use run.device=auto or cpu")
    if cfg.precision.name == "fp16" and device == "cpu":
        problems.append(
            "precision=fp16: fp16 with dynamic loss scaling needs a CUDA device, and this "
            "run is on cpu; use precision=bf16 or precision=fp32"
        )
    problems += spec.problems(cfg)  # the model's own checks (sizes, tp, pp)
    problems += loss_problems(cfg, spec)
    warnings: list[str] = spec.warnings(cfg)
    strategy_problems(cfg, problems, warnings)
    sync_problems(cfg, device, problems)
    try:
        facts = spec.facts()
    except ValueError:  # a model that cannot be built: its problems() said why
        raise ConfigError(problems) from None
    if par.activation_checkpointing in ("selective", "full") and not facts.num_layers:
        problems.append(
            f"parallel.activation_checkpointing={par.activation_checkpointing}: "
            f"model.kind={spec.kind} has no repeated blocks to checkpoint; use none"
        )
    before = len(problems)
    batch = batch_layout(cfg, facts, problems)
    pipeline = (
        None
        if script
        else pipeline_layout(cfg, spec, batch, problems, batch_ok=len(problems) == before)
    )
    script_run = script_plan(cfg, problems, workdir)
    problems += server_count_problems(cfg, facts)

    if problems:
        raise ConfigError(problems)

    opt = cfg.optim
    global_batch = batch.global_batch_size
    base_batch = opt.base_batch_size or global_batch
    ratio = global_batch / base_batch
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[opt.lr_scaling]
    lr = LRPlan(
        base_lr=opt.base_lr,
        base_batch_size=base_batch,
        scaling=opt.lr_scaling,
        peak_lr=opt.base_lr * factor,
        warmup_steps=opt.warmup_steps,
        decay=opt.decay,
        min_lr=min(opt.min_lr, opt.base_lr * factor),
        steps=tr.steps,
    )
    if pipeline is not None and (w := bubble_warning(pipeline, par.pp)):
        warnings.append(w)
    if opt.warmup_steps > tr.steps:  # a shortened try-out run: fine, the LR never peaks
        warnings.append(
            f"optim.warmup_steps={opt.warmup_steps} is longer than training "
            f"(train.steps={tr.steps}): the LR stays in warmup and never reaches its peak"
        )
    if opt.min_lr > lr.peak_lr:
        warnings.append(f"optim.min_lr={opt.min_lr} is above the scaled peak lr; capped to it")

    ck = cfg.checkpoint
    if ck.every_steps and tr.steps // ck.every_steps > MAX_SAVES:
        raise ConfigError(
            [
                f"checkpoint.every_steps={ck.every_steps}: {tr.steps // ck.every_steps:,} saves "
                f"in train.steps={tr.steps}; use at least "
                f"{math.ceil(tr.steps / MAX_SAVES)} (at most {MAX_SAVES:,} saves)"
            ]
        )
    save_steps = list(range(ck.every_steps, tr.steps + 1, ck.every_steps)) if ck.every_steps else []
    if ck.at_end and tr.steps not in save_steps:
        save_steps.append(tr.steps)

    threads = cfg.launcher.threads_per_proc or max(1, res.num_cpus // max(nproc, 1))
    plan = Plan(
        recipe=cfg.run.recipe,
        model=spec.name,
        world_size=world,
        nnodes=nnodes,
        nproc_per_node=nproc,
        device=device,
        backend=backend,
        threads_per_proc=threads,
        # another interpreter cannot be forked from this one: a fresh process per rank
        start_method="spawn" if script_run and script_run.python else cfg.launcher.start_method,
        max_restarts=cfg.launcher.max_restarts,
        mesh=MeshPlan(
            dim_names=list(MESH_DIM_NAMES), shape=[mesh_sizes[n] for n in MESH_DIM_NAMES]
        ),
        batch=batch,
        lr=lr,
        precision=PrecisionPlan(
            name=cfg.precision.name,
            autocast_dtype=AUTOCAST_DTYPE[cfg.precision.name],
            loss_scaling=cfg.precision.name == "fp16",
        ),
        checkpoint=CheckpointPlan(
            every_steps=ck.every_steps,
            every_minutes=ck.every_minutes,
            keep_last=ck.keep_last,
            at_end=ck.at_end,
            async_save=ck.async_save,
            steps=save_steps,
        ),
        estimates=estimate(cfg, spec, batch, pipeline),
        steps=tr.steps,
        strategy=par.strategy,
        pipeline=pipeline,
        warnings=warnings,
        loss=spec.default_loss() if tr.loss == "auto" else tr.loss,
        script=script_run,
        sync=sync_plan(cfg, facts, comm_bytes_per_step(cfg, facts, ddp=True)),
    )
    plan.estimates.activations_estimated = spec.activations_estimated()  # issue 24 #4
    if par.min_nnodes is not None and par.min_nnodes < nnodes:
        from dtrain_cli.plan.elastic import elastic_plan

        plan.elastic = elastic_plan(cfg, plan, lambda sub: build_plan(sub, res))
        if plan.max_restarts == 0:
            plan.warnings.append(
                f"parallel.nnodes={par.min_nnodes}:{nnodes} with launcher.max_restarts=0: a "
                "lost node ends the run (each loss uses one restart); set launcher.max_restarts"
            )
        if refused := [r["nnodes"] for r in plan.elastic.refused]:
            # the rendezvous admits any count in range (torch's min/max): a group of a
            # refused size starts, and its workers stop with the reason
            plan.warnings.append(
                f"parallel.nnodes={par.min_nnodes}:{nnodes}: {', '.join(map(str, refused))} "
                "node(s) cannot train this layout (see the elastic table); a group of that "
                "size fails at start-up with that reason (each try uses one restart)"
            )
    return plan
