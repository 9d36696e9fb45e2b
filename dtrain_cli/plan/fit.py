"""Whether a planned layout fits its device: the plan's peak memory per device
(:func:`.steptime.peak_memory`, what ``dtrain plan`` prints and ``dtrain advise`` ranks by)
against the hardware profile's capacity, said before a cluster finds it out. Torch-free.

    dtrain plan recipe=gpt_1b parallel.strategy=fsdp dp=8
    warning: peak memory per device estimated at 1,942 GiB, above hardware=h100_80g's
    78 GiB; most of it activations (1,742 GiB): train.micro_batch_size=16 ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.errors import ConfigError
from dtrain_cli.models.spec import ModelSpec
from dtrain_cli.plan.layout import plural
from dtrain_cli.plan.plan import Plan
from dtrain_cli.plan.steptime import GIB, Memory, peak_memory

Replan = Callable[[DtrainConfig], Plan]
SAYS = "peak memory per device estimated at"
"""How the warning begins (``dtrain simulate`` shows it beside its table)."""


def memory_warning(
    cfg: DtrainConfig, spec: ModelSpec, plan: Plan, replan: Replan | None = None
) -> str | None:
    """One line when the estimate is above the device's memory, with what dominates it and
    what lowers that; None when it fits, for a script (its model is its own) or under the
    CPU profile (the default) for a CUDA run, whose GPUs no profile was named for. A GPU
    profile is kept on any machine: ``dtrain plan`` here plans the cluster's run.
    ``replan``: the plan of another config (the caller's ``build_plan``), to find the
    largest micro-batch that fits."""
    m = _estimate(cfg, spec, plan)
    if m is None or m.fits:
        return None
    hw = cfg.hardware
    parts = {
        "parameters": m.params,
        "gradients": m.grads,
        "optimizer state": m.optimizer,
        "activations": m.activations,
        "temporary buffers": m.temporary,
    }
    most = max(parts, key=lambda k: parts[k])
    if most in ("activations", "temporary buffers"):  # both grow with the micro-batch
        remedy = _activation_remedy(cfg, spec, plan, replan)
    else:
        remedy = (
            "shard them over more devices (parallel.strategy=fsdp, or zero1 for the "
            "optimizer state), tp or pp"
        )
    return (
        f"{SAYS} {_gib(m.total)} GiB, above "
        f"hardware={hw.name}'s {_gib(m.capacity)} GiB; most of it {most} "
        f"({_gib(parts[most])} GiB): {remedy}; dtrain advise ranks the layouts that fit"
    )


REFUSED_AT = 1.5
"""A job for a cluster's queue estimated at this many times its device's memory or more is
not submitted (``dtrain sbatch --submit``, ``dtrain k8s --submit``; ``--force`` submits it):
it would wait its turn to run out of memory at its first step. The estimate is within 10%
of torchtitan's published peaks (bench/RESULTS.md); between 1x and this, a warning."""


def submit_refusal(cfg: DtrainConfig, spec: ModelSpec, plan: Plan) -> str | None:
    """One line when the estimate is :data:`REFUSED_AT` times the device's memory or more
    (what fits is in the warning printed above it); None otherwise."""
    m = _estimate(cfg, spec, plan)
    if m is None or m.total < REFUSED_AT * m.capacity:
        return None
    return (
        f"{SAYS} {_gib(m.total)} GiB, {m.total / max(m.capacity, 1):.1f}x "
        f"hardware={cfg.hardware.name}'s {_gib(m.capacity)} GiB: not submitted, it would "
        "run out of memory at its first step (the warning above says what fits; --force "
        "submits it anyway)"
    )


def _estimate(cfg: DtrainConfig, spec: ModelSpec, plan: Plan) -> Memory | None:
    """The plan's peak memory per device, or None where no profile describes the device."""
    hw = cfg.hardware
    if plan.script is not None or hw.memory_gib <= 0:
        return None
    if hw.device == "cpu" and plan.device != "cpu":
        return None
    return peak_memory(cfg, spec, plan, hw)


def _activation_remedy(
    cfg: DtrainConfig, spec: ModelSpec, plan: Plan, replan: Replan | None
) -> str:
    """What lowers the activations enough, each candidate planned whole: a smaller
    micro-batch; under GPipe (looped BFS), 1F1B (interleaved 1F1B), which holds at most a
    stage count of micro-batches,
    alone or with a smaller micro-batch; full activation checkpointing, alone or with a
    smaller micro-batch; else a split of the model."""
    if replan is None:
        return "a smaller train.micro_batch_size or parallel.activation_checkpointing=full"
    ac = None
    if cfg.parallel.activation_checkpointing != "full":
        ac = dataclasses.replace(
            cfg, parallel=dataclasses.replace(cfg.parallel, activation_checkpointing="full")
        )
    said = []
    mb = smaller_micro_batch(cfg, spec, plan, replan)
    if mb is not None:
        said.append(f"train.micro_batch_size={mb} (gradient accumulation keeps the global batch)")
        said += [_AC] if ac is not None and _fits(ac, spec, replan) else []
    else:
        if plan.pipeline is not None and plan.pipeline.schedule in FILL_DRAIN:
            schedule = FILL_DRAIN[plan.pipeline.schedule]
            pipe = dataclasses.replace(cfg.pipeline, schedule=schedule)
            one_f1b = dataclasses.replace(cfg, pipeline=pipe)
            said += _with_micro_batch(f"pipeline.schedule={schedule}", one_f1b, spec, plan, replan)
        if ac is not None:
            said += _with_micro_batch(_AC, ac, spec, plan, replan)
    if said:
        return ", or ".join(said)
    return "no smaller micro-batch and no activation checkpointing fits; split the model (tp, pp)"


_AC = "parallel.activation_checkpointing=full"
FILL_DRAIN = {"gpipe": "1f1b", "looped_bfs": "interleaved_1f1b"}
"""Schedules that hold every micro-batch's activations at once -> the one-forward-one-
backward schedule of the same stages per rank, which holds about a stage count."""


def _with_micro_batch(
    changed: str, other: DtrainConfig, spec: ModelSpec, plan: Plan, replan: Replan
) -> list[str]:
    """``changed`` (the setting that makes ``other``) where it fits at this micro-batch,
    else with the largest smaller micro-batch that fits; [] where neither does."""
    if _fits(other, spec, replan):
        return [changed]
    mb = smaller_micro_batch(other, spec, plan, replan)
    return [f"{changed} with train.micro_batch_size={mb}"] if mb is not None else []


def _fits(other: DtrainConfig, spec: ModelSpec, replan: Replan | None) -> bool:
    try:
        return replan is not None and peak_memory(other, spec, replan(other), other.hardware).fits
    except ConfigError:  # not a layout the plan takes (a schedule's micro-batch count)
        return False


def smaller_micro_batch(
    cfg: DtrainConfig, spec: ModelSpec, plan: Plan, replan: Replan | None
) -> int | None:
    """The largest micro-batch below this one that divides a rank's batch and whose plan
    fits, each planned whole (a GPipe schedule keeps every micro-batch in flight, so a
    smaller one need not lower its peak); None if none does or there is no ``replan``."""
    if replan is None:
        return None
    b = plan.batch
    per_rank = b.global_batch_size // max(b.dp, 1)
    for n in sorted((n for n in range(1, b.micro_batch_size) if per_rank % n == 0), reverse=True):
        train = dataclasses.replace(cfg.train, micro_batch_size=n, grad_accum=None)
        pipe = dataclasses.replace(cfg.pipeline, microbatches=None)
        if _fits(dataclasses.replace(cfg, train=train, pipeline=pipe), spec, replan):
            return n
    return None


def _gib(n: float) -> str:
    return f"{n / GIB:,.0f}" if n >= 10 * GIB else f"{n / GIB:.1f}"


def host_warnings(plan: Plan, cpus: int, ram_bytes: int) -> list[str]:
    """A CPU plan this machine would run as it is: its ranks' memory above the machine's
    (each builds and holds its own share: gpt_1b at dp=8 tp=8 pp=2 is 128 ranks of 1.4 GiB
    here), or far more ranks than cores."""
    n, each = plan.nproc_per_node, plan.estimates.bytes_total
    elsewhere = (
        "plan it for its cluster (dtrain sbatch, dtrain k8s) or run one rank of it "
        "(dtrain simulate)"
    )
    if plan.estimates.activations_estimated and n * each > ram_bytes:
        return [
            f"{n} process(es) on this machine would hold about {_gib(n * each)} GiB ("
            f"{_gib(each)} GiB each), above its {_gib(ram_bytes)} GiB of memory: {elsewhere}"
        ]
    if n > 8 * cpus:
        return [
            f"{n} processes on this machine's {cpus} CPU core(s) take turns (each step about "
            f"{n // cpus}x slower than with a core each): fewer ranks here, or {elsewhere}"
        ]
    return []


def device_problems(cfg: DtrainConfig, device: str, nproc: int, num_gpus: int) -> list[str]:
    """What the device asked for cannot do here: more processes than visible GPUs, CUDA
    where there is none, fp16's loss scaling on the CPU."""
    problems = []
    if device == "cuda" and nproc > num_gpus:
        problems.append(
            f"{plural(nproc, 'process', 'processes')} per node {'needs' if nproc == 1 else 'need'} "
            f"{plural(nproc, 'GPU')} but "
            f"{num_gpus} {'is' if num_gpus == 1 else 'are'} visible; "
            f"lower dp/tp/pp or set run.device=cpu"
        )
    if cfg.run.device == "cuda" and num_gpus == 0:
        problems.append("run.device=cuda: no GPU is visible here; use run.device=auto or cpu")
    if cfg.precision.name == "fp16" and device == "cpu":
        gpus = cfg.hardware.device == "cuda"  # planned for a GPU cluster from this machine
        problems.append(
            "precision=fp16: fp16 with dynamic loss scaling needs a CUDA device, and this "
            "run is on cpu; use precision=bf16 or precision=fp32"
            + (f" (for hardware={cfg.hardware.name}'s GPUs: dtrain sbatch or dtrain k8s "
               "plans its job, dtrain simulate runs a rank of it here)" if gpus else "")
        )  # fmt: skip
    return problems


def threads_per_process(
    cfg: DtrainConfig, num_cpus: int, omp_threads: int | None, procs: int
) -> tuple[int, list[str]]:
    """torch's intra-op threads per rank: ``launcher.threads_per_proc``, else the shell's
    ``OMP_NUM_THREADS`` (kept, as torchrun keeps it; dtrain's workers set it over), else
    the node's cores over its processes; with a warning when the threads outnumber the
    cores (every step then waits on threads the cores cannot run at once)."""
    given = cfg.launcher.threads_per_proc or omp_threads
    fair = max(1, num_cpus // max(procs, 1))
    threads = given or fair
    if not given or not num_cpus or threads <= fair or threads * procs <= num_cpus:
        return threads, []  # more processes than cores alone is said elsewhere
    source = "launcher.threads_per_proc" if cfg.launcher.threads_per_proc else "OMP_NUM_THREADS"
    return threads, [
        f"{source}={threads} x {plural(procs, 'process', 'processes')} = {threads * procs} "
        f"threads on {plural(num_cpus, 'core')}: oversubscribed (each step waits on threads "
        f"the cores cannot run at once); at most {fair} per process"
    ]
