"""The worker entry point the elastic agent (local) or srun (SLURM) starts on every rank.

It reads ``config.yaml`` and ``plan.yaml`` from the run directory (the launcher composed
them once), sets up logging, the process group and mesh, and runs the Trainer.
``@record`` writes this rank's traceback where the agent finds it, so the launcher can
show the failing rank's error.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from dtrain_cli.config.compose import config_from_yaml
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.notes import write_note
from dtrain_cli.runtime.components import preemption
from dtrain_cli.runtime.diagnostics import collective_debug, peak_memory
from dtrain_cli.runtime.diagnostics.interrupt import InterruptGuard, restore_default_signals
from dtrain_cli.runtime.diagnostics.launcher_watch import end_with_launcher
from dtrain_cli.runtime.diagnostics.logs import make_console, setup_logging
from dtrain_cli.runtime.diagnostics.watchdog import enable_flight_recorder, process_group_timeout_s
from dtrain_cli.runtime.parallel.mesh import (
    init_distributed,
    mesh_coordinates,
    shutdown_distributed,
)
from dtrain_cli.runtime.trainer import Trainer

if TYPE_CHECKING:
    from rich.console import Console

log = logging.getLogger("dtrain")


def _stop_quietly(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # @record and multiprocessing print no traceback for it


@record
def worker_main(
    run_dir: str, launcher_milestones: dict[str, float] | None = None
) -> dict[str, Any]:
    """One rank's run. ``launcher_milestones``: epoch times the launcher recorded before
    this worker started (config composed, agent ready), for the start-up breakdown."""
    started = time.time()
    restore_default_signals()  # forked from the fork server (it ignores some) or the agent
    end_with_launcher()  # a SIGKILLed launcher leaves no worker training alone
    # Ctrl-C reaches every process of the terminal's group; the launcher reports it once,
    # so a worker ends quietly (its finally blocks close the progress bar), no traceback
    # (within seconds even when the main thread waits in C code: a store, a collective)
    InterruptGuard(grace_s=2.0, finish_s=5.0).install(_stop_quietly)
    path = Path(run_dir)
    plan, cfg, rank, console = arrive(path)
    collective_debug.enable(cfg.debug.check_collectives)
    enable_flight_recorder(plan.backend, cfg.debug.collective_timeout_s)
    timeout = process_group_timeout_s(cfg.debug.collective_timeout_s, cfg.debug.hang_watchdog)
    ctx = init_distributed(plan, timeout_s=timeout)
    pg_ready = time.time()
    log.info("rank %d mesh coordinates %s", rank, json.dumps(mesh_coordinates(ctx)))
    if ctx.role == "server":  # sync.mode=param_server: this rank serves a parameter shard
        from dtrain_cli.runtime.sync.param_server import serve

        try:
            return serve(cfg, plan, ctx, path)
        finally:
            shutdown_distributed()
    trainer = None
    try:
        trainer = Trainer(cfg, plan, ctx, path, console)
        trainer.times.update(
            launcher_milestones or {},
            worker_start=started,
            process_group_ready=pg_ready,
            model_ready=time.time(),
        )
        log.info(
            "rank %d start-up peak memory: %s", rank, peak_memory.describe(trainer.startup_peak)
        )
        result = trainer.train()
    except Exception as exc:
        log.exception("rank %d failed", rank)  # the traceback in logs/rank_<k>.log
        write_note(path, rank, trainer.step if trainer is not None else None, exc)
        if (mismatch := collective_debug.explain(str(exc))) is not None:
            raise collective_debug.CollectiveMismatch(mismatch) from None
        raise
    finally:
        if trainer is not None and trainer.sink:
            trainer.sink.close()
        shutdown_distributed()
    if result.get("preempted") and result.get("signal") == signal.SIGTERM:
        leave_at_once()
    return result


def arrive(path: Path) -> tuple[Plan, DtrainConfig, int, Console | None]:
    """Read the run directory's plan and config, and set up what this rank needs before its
    process group: the user's import roots, threads, logging, the preemption flag."""
    run = RunDir(path)
    env.set_run_dir(path)  # where a fault drill notes what it did
    # an elastic plan carries a layout per node count: the one for the size started
    plan = Plan.load(run.plan).for_world_size(int(os.environ["WORLD_SIZE"]))
    cfg = config_from_yaml(run.config)
    for root in reversed(cfg.run.import_roots):  # the user's _target_ modules, as planned
        if root not in sys.path:
            sys.path.insert(0, root)
    # the launcher's (a job's agent counts its own node's cores: launch/local.py sets it)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or plan.threads_per_proc))
    rank = int(os.environ["RANK"])
    console = make_console(rank == 0)
    setup_logging(path, rank, console)
    if plan.elastic is not None and rank == 0:
        # the agent stops a group with SIGTERM before a scale-up: that group checkpoints
        # (preemption) and its marker is stale once this group runs
        protocol.clear_preempted(run)
    preemption.install(cfg.cluster.signal, cfg.cluster.checkpoint_on_sigterm)  # flag only
    return plan, cfg, rank, console


def leave_at_once() -> None:
    """SIGTERM is how the elastic agent stops its workers (a membership change, its own
    shutdown): it is closing the group and reads no return value, and torch's worker
    wrapper would wait for it to be read until the agent's SIGKILL, 30 s later."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
