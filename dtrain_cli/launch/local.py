"""Start the workers on this node with torch's elastic agent (the machinery behind torchrun).

c10d rendezvous, ``max_restarts`` from the plan, and the workers started from a fork
server that imported torch, the runtime and what the plan needs before step 1
(:mod:`.worker_server`, the default ``start_method=forkserver``). ``fork`` forks them
from the agent after it imported the same once (:mod:`dtrain_cli.runtime.preload`);
``spawn`` starts fresh interpreters. Nothing here initializes CUDA before a fork.

The workers get the launcher's start-up milestones (composed, agent ready; epoch seconds)
as an argument, for the start-up breakdown of the run summary.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.launch.signals import forward_signal, no_orphans
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime import preemption

# Errors the runtime raises on purpose, with a message that names the cause: shown as one
# line (their traceback stays in logs/rank_<k>.log).
EXPECTED_ERRORS = ("CheckpointError:", "FileNotFoundError:", "ValueError: ")


def worker_modules(run_dir: Path, cfg: DtrainConfig, plan: Plan) -> list[str]:
    from dtrain_cli.checkpoint.catalog import has_checkpoint
    from dtrain_cli.launch.script import script_preload

    if plan.script is not None:
        return script_preload(plan)
    from dtrain_cli.runtime.preload import modules_before_first_step

    return modules_before_first_step(cfg, plan, resuming=has_checkpoint(run_dir))


def prepare_workers(run_dir: Path, cfg: DtrainConfig, plan: Plan) -> None:
    """Get what the workers need before step 1 imported once: ``forkserver``, by the
    server (started here if the launch command did not); ``fork``, here, so the forked
    workers inherit it. Any other start method ends a server started for nothing."""
    from dtrain_cli.launch import worker_server

    if plan.start_method == "forkserver":
        worker_server.start()
        worker_server.announce(worker_modules(run_dir, cfg, plan))
        return
    worker_server.stop()
    if plan.start_method == "fork":
        for name in worker_modules(run_dir, cfg, plan):
            importlib.import_module(name)


@dataclass
class LaunchResult:
    ok: bool
    exit_code: int
    message: str = ""


def launch_local(
    run_dir: Path,
    cfg: DtrainConfig,
    plan: Plan,
    node_rank: int | None = None,
    launcher_milestones: dict[str, float] | None = None,
) -> LaunchResult:
    """Start this node's workers. Multi-node: every node's agent meets at
    ``launcher.rdzv_endpoint`` under ``launcher.rdzv_id``; ``node_rank`` 0 hosts the
    rendezvous store (worker ranks are assigned by the rendezvous, as with torchrun)."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from dtrain_cli.launch.script import failure_tail, script_entry

    milestones = {**(launcher_milestones or {}), "agent_ready": time.time()}
    if plan.script is None:  # your own script needs neither the trainer nor the corpus
        from dtrain_cli.runtime.data import prepare_corpus
        from dtrain_cli.runtime.worker import worker_main  # here: forked workers inherit it

        # once, before workers start (cached: a no-op after `dtrain launch` prepared it)
        prepare_corpus(cfg.data, cfg.train.seed, getattr(cfg.model, "vocab_size", None))
    # The agent's own logs repeat what dtrain reports (the failing rank and its error).
    for name in (
        "torch.distributed.elastic",
        "torch.distributed.launcher",
        "torch.multiprocessing",
    ):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", str(plan.threads_per_proc))
    lc = cfg.launcher
    config = LaunchConfig(
        min_nodes=plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=lc.rdzv_id or f"dtrain-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint=lc.rdzv_endpoint,
        rdzv_configs={
            "timeout": lc.rdzv_timeout_s,
            "join_timeout": lc.rdzv_timeout_s,  # what c10d reads ("timeout" is etcd's)
            **({"is_host": node_rank == 0} if node_rank is not None and plan.nnodes > 1 else {}),
        },
        max_restarts=plan.max_restarts,
        monitor_interval=lc.monitor_interval_s,
        start_method=plan.start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs" / "elastic")),
        **({"role": "default"} if plan.script else {}),  # ROLE_NAME as torchrun sets it
    )
    if plan.script is not None:  # your own script (dtrain run train.py)
        entry, args = script_entry(run_dir, plan, config.signals_to_handle)
    else:
        entry, args = worker_main, (str(run_dir), milestones)
    preemption.clear_marker(run_dir)
    try:
        with forward_signal(cfg.cluster.signal), no_orphans(plan.script is not None):
            elastic_launch(config, entry)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        detail = failure.message if isinstance(failure.message, str) else str(failure.message)
        if failure.error_file_data:
            trace = failure.error_file_data.get("message", {})
            if isinstance(trace, dict):
                stack = trace.get("extraInfo", {}).get("py_callstack", "")
                detail = f"{trace.get('message', '')}\n{stack}"
        if detail.startswith(EXPECTED_ERRORS):  # dtrain's own errors: the message says it all
            detail = detail.splitlines()[0]
        if plan.script is not None:  # the script's own last lines, as python printed them
            detail = failure_tail(run_dir, rank) or detail
        code = failure.exitcode if failure.exitcode and failure.exitcode > 0 else 1
        return LaunchResult(
            False, code, f"rank {rank} failed (exit code {failure.exitcode}): {detail.strip()}"
        )
    except SignalException as exc:
        if (marker := preemption.read_marker(run_dir)) is not None:
            return preempted_result(marker)
        return LaunchResult(
            False, 128 + int(exc.sigval), f"stopped by {exc.sigval.name}; workers terminated"
        )
    if (marker := preemption.read_marker(run_dir)) is not None:
        return preempted_result(marker)
    return LaunchResult(True, 0)


def preempted_result(marker: dict) -> LaunchResult:
    if marker.get("by") == "script":
        return LaunchResult(
            False,
            preemption.EXIT_PREEMPTED,
            f"preempted: rank {marker.get('rank')}'s script saved its checkpoint and exited "
            f"{preemption.EXIT_PREEMPTED}; a requeued SLURM job (or running it again) continues",
        )
    return LaunchResult(
        False,
        preemption.EXIT_PREEMPTED,
        f"preempted: checkpoint saved at step {marker.get('step')}; the run continues from it "
        "(requeued SLURM job, or `dtrain resume --ckpt RUN_DIR`)",
    )
