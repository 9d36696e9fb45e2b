"""Start the workers on this node with torch's elastic agent (the machinery behind torchrun).

c10d rendezvous, ``max_restarts`` from the plan, and the workers started from a fork
server that imported torch, the runtime and what the plan needs before step 1
(:mod:`.worker_server`, the default ``start_method=forkserver``). ``fork`` forks them
from the agent after it imported the same once (:mod:`dtrain_cli.launch.preload`);
``spawn`` starts fresh interpreters. Nothing here initializes CUDA before a fork.

The workers get the launcher's start-up milestones (composed, agent ready; epoch seconds)
as an argument, for the start-up breakdown of the run summary.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.import_gc import imports_without_collection
from dtrain_cli.launch import failures, hang_report
from dtrain_cli.launch.every_failure import every_failed_process
from dtrain_cli.launch.exit_barrier import end_when_signalled_at_exit_barrier
from dtrain_cli.launch.hang_guard import reap_frozen_ranks
from dtrain_cli.launch.preload import WORKER_ENTRY, entry_point, worker_modules
from dtrain_cli.launch.rendezvous_failure import rendezvous_failure
from dtrain_cli.launch.signals import (
    forward_signal,
    interrupted,
    no_orphans,
    pool_follows_job_control,
)
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.notes import read_notes


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
        with imports_without_collection():  # the forked workers keep them: frozen
            for name in worker_modules(run_dir, cfg, plan):
                importlib.import_module(name)


@dataclass(kw_only=True)
class LaunchResult:
    ok: bool
    exit_code: int
    message: str = ""
    workers_started: bool = True


QUIET_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
"""The agent's own logs repeat what dtrain reports (the failing rank and its error, "Received
2 death signal" on Ctrl-C). Its modules set their own levels, so the parent's level does not
reach them: the parent swallows what they propagate."""


AGENT_MODULES = (
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch.distributed.elastic.rendezvous.api",
    "torch.distributed.launcher.api",
)
"""What :func:`run_agent` imports: torch's elastic agent and its errors."""


def launch_local(
    run_dir: Path,
    cfg: DtrainConfig,
    plan: Plan,
    node_rank: int | None = None,
    launcher_milestones: dict[str, float] | None = None,
    join: bool = False,
    report: Callable[[LaunchResult], None] | None = None,
) -> LaunchResult:
    """Start this node's workers. Multi-node: every node's agent meets at
    ``launcher.rdzv_endpoint`` under ``launcher.rdzv_id``; ``node_rank`` 0 hosts the
    rendezvous store (worker ranks are assigned by the rendezvous, as with torchrun);
    a node that ``join``s a running elastic run never hosts it. ``report``: how the caller
    shows an outcome, for the one this process ends with by itself: a termination signal
    while its agent waits at torch's exit barrier (:mod:`.exit_barrier`)."""
    try:
        prepared = _prepare_agent(run_dir, cfg, plan, node_rank, launcher_milestones, join)
    except KeyboardInterrupt:  # Ctrl-C while the agent was readied: no worker started
        prepared = STOPPED_BEFORE_START
    if isinstance(prepared, LaunchResult):
        return prepared
    config, entry, args, milestones = prepared
    return run_agent(
        config, entry, args, run_dir, cfg, plan, report, since=milestones["agent_ready"]
    )


STOPPED_BEFORE_START = LaunchResult(
    ok=False,
    exit_code=protocol.EXIT_INTERRUPTED,
    message="stopped by SIGINT before the workers started",
    workers_started=False,
)


def _prepare_agent(
    run_dir: Path,
    cfg: DtrainConfig,
    plan: Plan,
    node_rank: int | None,
    launcher_milestones: dict[str, float] | None,
    join: bool,
) -> LaunchResult | tuple[Any, Any, tuple, dict[str, float]]:
    """The agent's config, entry point and arguments, before any worker starts; or the
    outcome that ends the start here."""
    with imports_without_collection():  # torch, for the agent: the start-up's critical path
        for name in AGENT_MODULES:
            importlib.import_module(name)

    from dtrain_cli.launch.rendezvous_events import name_events_cheaply
    from dtrain_cli.launch.script import script_entry

    name_events_cheaply()  # most of a second of the rendezvous' CPU (see the module)
    milestones = {**(launcher_milestones or {}), "agent_ready": time.time()}
    if plan.script is None:  # your own script needs neither the trainer nor the corpus
        from dtrain_cli.corpus.prepare import prepare_corpus

        worker = entry_point(WORKER_ENTRY)  # here: forked workers inherit it
        # once, before workers start (cached: a no-op after `dtrain launch` prepared it)
        vocab = getattr(cfg.model, "vocab_size", None)
        prepare_corpus(cfg.data, cfg.train.seed, vocab, cfg.run.import_roots)
    quiet_torch_loggers()
    # the plan's: the config's launcher.threads_per_proc, else the shell's OMP_NUM_THREADS
    os.environ["OMP_NUM_THREADS"] = str(plan.threads_per_proc)
    config = launch_config(run_dir, cfg, plan, node_rank, join)
    if plan.script is not None:  # your own script (dtrain run train.py)
        entry, args = script_entry(run_dir, plan, config.signals_to_handle)
    else:
        entry, args = worker, (str(run_dir), milestones)
    run = RunDir(run_dir)
    if not join:  # a joining node's records are the running group's, not this start's
        protocol.clear_preempted(run)
        hang_report.clear(run_dir)
    if config.rdzv_configs.get("is_host") is False and (why := _store_unreached(cfg)):
        return LaunchResult(ok=False, exit_code=1, message=why)
    milestones["agent_ready"] = time.time()
    if interrupted():  # a Ctrl-C during start-up that an import swallowed
        return STOPPED_BEFORE_START
    return config, entry, args, milestones


def _store_unreached(cfg: DtrainConfig) -> str | None:
    """Why node 0's store cannot be reached (None: it answers), before torch's client tries
    and prints its C++ stack frames at each retry."""
    from dtrain_cli.launch.multinode import STORE_WAIT_S, wait_for_store
    from dtrain_cli.rundir.env import in_scheduler_job

    lc = cfg.launcher
    say = partial(print, file=sys.stderr, flush=True)
    # a scheduler starts the nodes, node 0 maybe minutes after the rest (a pod pulling its
    # image, pending on a busy cluster): there they wait the whole rendezvous timeout
    wait_s = lc.rdzv_timeout_s if in_scheduler_job() else min(lc.rdzv_timeout_s, STORE_WAIT_S)
    if (why := wait_for_store(lc.rdzv_endpoint, wait_s, say)) is None:
        return None
    return (
        f"this node could not reach the rendezvous store at {lc.rdzv_endpoint} (id "
        f"{lc.rdzv_id}): {why}; start node 0 (--node-rank 0) first, with the same "
        "--rdzv-endpoint, and check that this node reaches its host and port"
    )


def quiet_torch_loggers() -> None:
    """Silence the loggers of :data:`QUIET_LOGGERS`: dtrain reports what they would say."""
    for name in QUIET_LOGGERS:
        quiet = logging.getLogger(name)
        quiet.setLevel(logging.CRITICAL)
        quiet.handlers = [logging.NullHandler()]
        quiet.propagate = False


def run_agent(
    config: Any,
    entry: Callable[..., Any] | str,
    args: tuple[Any, ...],
    run_dir: Path,
    cfg: DtrainConfig,
    plan: Plan,
    report: Callable[[LaunchResult], None] | None,
    since: float,
) -> LaunchResult:
    """torch's elastic agent (``elastic_launch``) under dtrain's guards for signals, the
    warm pool, orphans, frozen ranks and the exit barrier; its outcome as a result. ``since``:
    when the agent was ready (a failure's report counts from it)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousError,
    )
    from torch.distributed.launcher.api import elastic_launch

    run = RunDir(run_dir)
    try:
        with (
            forward_signal(cfg.cluster.signal),
            pool_follows_job_control(),
            no_orphans(plan.script is not None),
            reap_frozen_ranks(run_dir, plan.world_size),  # a stopped rank ends the run too
            end_when_signalled_at_exit_barrier(
                partial(_end_at_barrier, run_dir, report, plan.nnodes)
            ),
            every_failed_process(run_dir),  # a killed rank and the peer that lost it: both
        ):
            elastic_launch(config, entry)(*args)
    except ChildFailedError as exc:  # the first failure in time, not torch's whole-second pick
        return failed_result(exc, run_dir, plan, since=since)
    except RendezvousClosedError:  # an elastic node (re)joining a run that has ended
        where = f"{cfg.launcher.rdzv_endpoint} (id {config.run_id})"
        return LaunchResult(ok=False, exit_code=1, message=f"the run at {where} has already ended")
    except RendezvousError as exc:  # the nodes never met: said in one line, not torch's trace
        since = env.launch_started_at()  # trained in this launch, not an earlier attempt's
        trained = run.metrics.is_file() and run.metrics.stat().st_mtime >= since
        said = rendezvous_failure(exc, config, cfg, trained=trained)
        return LaunchResult(ok=False, exit_code=1, message=said)
    except SignalException as exc:
        if (marker := protocol.read_preempted(run)) is not None:
            return preempted_result(marker, run_dir, plan.nnodes)
        return LaunchResult(
            ok=False,
            exit_code=128 + int(exc.sigval),
            message=f"stopped by {exc.sigval.name}; workers terminated",
        )
    if (marker := protocol.read_preempted(run)) is not None:
        return preempted_result(marker, run_dir, plan.nnodes)
    return LaunchResult(ok=True, exit_code=0)


def launch_config(
    run_dir: Path, cfg: DtrainConfig, plan: Plan, node_rank: int | None, join: bool
) -> Any:
    """torch's ``LaunchConfig`` for this node: c10d rendezvous, restarts, start method,
    and for an elastic run the membership timings."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    lc = cfg.launcher
    elastic = {}
    if plan.elastic is not None:  # a lost node is dropped after node_timeout_s (heartbeats)
        # A fresh store per group: with the rendezvous' TCP store shared, a node that joins
        # a running group waits forever for the round's MASTER_ADDR (torch publishes it
        # only on the first round of the node that stays rank 0), and the nodes' restart
        # counts differ after a change, so no per-attempt prefix would match either.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        beat = max(1, lc.node_timeout_s // 3)
        elastic = {
            "last_call_timeout": lc.last_call_s,
            "keep_alive_interval": beat,
            "keep_alive_max_attempt": max(1, lc.node_timeout_s // beat),
        }
    hosting = {"is_host": node_rank == 0} if node_rank is not None and plan.nnodes > 1 else {}
    return LaunchConfig(
        min_nodes=plan.elastic.min_nnodes if plan.elastic else plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=lc.rdzv_id or f"dtrain-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint=lc.rdzv_endpoint,
        rdzv_configs={
            "timeout": lc.rdzv_timeout_s,
            "join_timeout": lc.rdzv_timeout_s,  # what c10d reads ("timeout" is etcd's)
            **hosting,
            **({"is_host": False} if join else {}),
            **elastic,
        },
        max_restarts=plan.max_restarts,
        monitor_interval=lc.monitor_interval_s,
        start_method=plan.start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(RunDir(run_dir).agent_logs)),
        **({"role": "default"} if plan.script else {}),  # ROLE_NAME as torchrun sets it
    )


def failed_result(exc: Any, run_dir: Path, plan: Plan, since: float) -> LaunchResult:
    """A watchdog's hang report (stuck where), or the first failure in time with its cause
    (:mod:`.failures`; your script's own last lines, as python printed them)."""
    from dtrain_cli.launch.script import script_failure

    if (hang := hang_report.hang_report(run_dir, plan.world_size)) is not None:
        return LaunchResult(ok=False, exit_code=protocol.EXIT_HANG, message=hang)
    local_ranks = list(range(plan.world_size)) if plan.nnodes == 1 else None
    notes = read_notes(run_dir, since=since)
    failed = failures.from_agent(exc.failures, notes, local_ranks)
    if plan.script is not None:
        code, text = script_failure(failed, run_dir, plan)
    else:
        code, text = failures.describe(failed, multi_node=plan.nnodes > 1)
    return LaunchResult(ok=False, exit_code=code, message=text)


def _end_at_barrier(
    run_dir: Path, report: Callable[[LaunchResult], None] | None, nnodes: int, signum: int
) -> NoReturn:
    """The launch's outcome when a termination signal found its agent at the exit barrier,
    its workers ended: reported, then this process ends with its exit code."""
    if (marker := protocol.read_preempted(RunDir(run_dir))) is not None:
        result = preempted_result(marker, run_dir, nnodes)
    else:
        name = signal.Signals(signum).name
        result = LaunchResult(
            ok=False,
            exit_code=128 + signum,
            message=f"stopped by {name} while waiting for the other nodes' agents at the "
            "end (this node's workers had ended)",
        )
    if report is not None:
        report(result)
    from multiprocessing import util

    with contextlib.suppress(Exception):  # what its exit handler would unlink first: the
        util._run_finalizers(0)  # agent's queues' semaphores (else the tracker warns)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(result.exit_code)


def preempted_result(marker: dict, run_dir: Path, nnodes: int = 1) -> LaunchResult:
    """``nnodes`` > 1: the same launch command on every node continues it (``dtrain
    resume`` starts this machine's workers only, and refuses such a run)."""
    code = protocol.EXIT_PREEMPTED
    resume = f"`dtrain resume --ckpt {shlex.quote(str(run_dir))}`"
    if nnodes > 1:
        resume = "the same launch command on every node"
    if marker.get("by") == "script":
        text = (
            f"preempted: rank {marker.get('rank')}'s script saved its checkpoint and exited "
            f"{code}; {resume} runs it again in its run directory{_by_itself()}"
        )
    else:
        text = (
            f"preempted: checkpoint saved at step {marker.get('step')}; {resume} continues "
            f"from it{_by_itself()}"
        )
    return LaunchResult(ok=False, exit_code=code, message=text)


def _by_itself() -> str:
    """Who continues a preempted run without being asked, where this node runs."""
    slurm, pod = env.SCHEDULER_JOB
    if os.environ.get(slurm):
        return " (a requeued SLURM job does so by itself)"
    if os.environ.get(pod):
        return " (the JobSet's restarted pods do so by themselves)"
    return ""
