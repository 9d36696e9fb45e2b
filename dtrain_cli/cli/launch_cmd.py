"""``dtrain launch recipe=gpt_small dp=2``: compose -> plan -> run dir -> workers."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from dtrain_cli.cli.common import (
    CONFIG_DIR_HELP,
    OVERRIDES_HELP,
    complete_override,
    compose_and_plan,
    console,
    err_console,
    fail,
    print_warnings,
)
from dtrain_cli.errors import ConfigError
from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import EXIT_INTERRUPTED, EXIT_PREEMPTED

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.launch.local import LaunchResult
    from dtrain_cli.plan.plan import Plan


def launch(
    overrides: list[str] = typer.Argument(
        None, help=OVERRIDES_HELP, autocompletion=complete_override
    ),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    nnodes: str | None = typer.Option(
        None, "--nnodes", help="Nodes: N, or MIN:MAX (elastic); run on each node."
    ),
    node_rank: int | None = typer.Option(None, "--node-rank", help="This node: 0 hosts rdzv."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="node0 host:port."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Same on every node; run name."),
) -> None:
    """Train: compose the recipe, save config.yaml + plan.yaml in a new run dir, start workers.

    Guide: docs/configuration.md
    """
    env.mark_launch_start()
    from dtrain_cli.launch.signals import watch_interrupt

    watch_interrupt()
    try:
        _launch(overrides, config_dir, nnodes, node_rank, rdzv_endpoint, rdzv_id)
    except KeyboardInterrupt:
        fail(["stopped by SIGINT before the workers started"], 130)


def _launch(
    overrides: list[str] | None,
    config_dir: list[Path],
    nnodes: str | None,
    node_rank: int | None,
    rdzv_endpoint: str | None,
    rdzv_id: str | None,
) -> None:
    from dtrain_cli.launch import worker_server

    worker_server.start(overrides)  # imports torch on another core while we compose
    start_run(list(overrides or []), config_dir, nnodes, node_rank, rdzv_endpoint, rdzv_id)


def start_run(
    overrides: list[str],
    config_dirs: list[Path],
    nnodes: str | None = None,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    script: list[str] | None = None,
    before_start: Callable[[DtrainConfig, Plan], None] | None = None,
) -> None:
    """compose -> plan -> run dir -> workers: ``dtrain launch``, and ``dtrain run`` with
    its ``script`` (``["train.py", *args]`` or ``["-m", "mod", *args]``). ``before_start``
    runs once the plan is checked, before the run dir is written (the cluster check)."""
    from dtrain_cli.launch.multinode import (
        NodeArgs,
        apply_node_args,
        join_run_dir,
        nnodes_override,
        parse_nnodes,
    )

    counts, problems = parse_nnodes(nnodes)
    extra = nnodes_override(counts)
    count = counts[1] if counts else None
    if problems:
        fail(problems)
    cfg, plan = compose_and_plan(
        [*overrides, *extra], config_dirs, script, on_composed=announce_layout
    )
    composed = time.time()
    problems = apply_node_args(cfg, NodeArgs(count, node_rank, rdzv_endpoint, rdzv_id))
    if problems:
        fail(problems)
    # before anything is written: a host that does not resolve makes c10d hang
    if plan.nnodes > 1 and (problems := rendezvous_problems(cfg, plan, node_rank)):
        fail(problems)
    if before_start is not None:
        before_start(cfg, plan)
    if plan.script is None:  # a script's data is its own
        prepare_data(cfg, plan)

    from dtrain_cli.launch.rundir import materialize, new_run_dir

    path = (Path(cfg.run.root) / str(cfg.run.name)) if plan.nnodes > 1 else new_run_dir(cfg)
    # only what this start creates is removed; a script's only before its workers start
    made = plan.nnodes == 1 and not path.exists()
    fresh = made and plan.script is None
    fresh_root = made and not path.parent.exists()
    try:
        run_dir = join_run_dir(cfg, plan) if plan.nnodes > 1 else materialize(cfg, plan, path)
    except KeyboardInterrupt:  # Ctrl-C while the run dir was written: none of it stays
        remove_if_untrained(path, fresh, fresh_root)
        raise
    except FileExistsError as exc:
        by_id = rdzv_id is not None and cfg.run.name == rdzv_id  # --rdzv-id names the run
        fail([f"{'--rdzv-id' if by_id else 'run.name'}={cfg.run.name}: {exc}"])
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        fail([f"run.root={cfg.run.root}: cannot create the run directory ({why})"])
    script_fresh = made and plan.script is not None
    start_workers(
        run_dir,
        cfg,
        plan,
        node_rank,
        {"composed": composed},
        fresh,
        fresh_root,
        script_fresh=script_fresh,
    )


def announce_layout(cfg: DtrainConfig) -> None:
    """The fork server imports what the config's layout and model kind need (DDP's
    torch._dynamo...) while the plan is made; the rest comes with the plan. Not for a
    script (a recipe can name one): its workers import what the script does."""
    from dtrain_cli.launch import worker_server
    from dtrain_cli.launch.preload import modules_known_once_composed
    from dtrain_cli.plan.script import is_script

    if is_script(cfg):
        return
    with contextlib.suppress(OSError):  # only a speed-up: a full temp folder loses it
        worker_server.announce(modules_known_once_composed(cfg), last=False)


def rendezvous_problems(cfg: DtrainConfig, plan: Plan, node_rank: int | None) -> list[str]:
    """validate-cluster's static rendezvous checks (host resolves, port free on node 0),
    one line each; loopback only warns (several nodes on one machine)."""
    from dtrain_cli.launch.cluster_env import FAIL, WARN, Request, gather_facts, static_checks

    req = Request(
        nnodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        node_rank=node_rank,
        rdzv_endpoint=cfg.launcher.rdzv_endpoint,
        backend=plan.backend,
        single_host=True,
    )
    facts = gather_facts(with_torch=False)
    facts.writable = lambda path: None  # the run dir's check would create it: not here
    checks = [c for c in static_checks(req, facts) if "rendezvous" in c.name]
    for c in checks:
        if c.status == WARN:
            err_console.print(f"warning: {c.detail}", highlight=False, soft_wrap=True)
    return [
        f"--rdzv-endpoint={cfg.launcher.rdzv_endpoint}: {c.detail}; {c.fix}"
        for c in checks
        if c.status == FAIL
    ]


def prepare_data(cfg: DtrainConfig, plan: Plan | None = None) -> None:
    """Tokenize/cache the corpus, or build and check a custom dataset, before the run dir
    exists: a problem found here leaves nothing behind. With the ``plan``: a run that would
    pass over a small corpus many times is warned of."""
    from dtrain_cli.config.data_checks import vocab_key
    from dtrain_cli.corpus.prepare import epochs_warning, prepare_corpus, window_problems

    vocab, key = getattr(cfg.model, "vocab_size", None), vocab_key(cfg)
    try:
        paths = prepare_corpus(cfg.data, cfg.train.seed, vocab, cfg.run.import_roots, key)
    except (ConfigError, FileNotFoundError) as exc:
        fail(exc.problems if isinstance(exc, ConfigError) else [str(exc)])
    block = getattr(cfg.model, "block_size", None)
    if problems := window_problems(cfg.data, paths, block, vocab):
        fail(problems)
    samples = plan.steps * plan.batch.global_batch_size if plan is not None else 0
    if plan is not None and (said := epochs_warning(cfg.data, paths, block, samples)):
        print_warnings([said])


def start_workers(
    run_dir: Path,
    cfg: DtrainConfig,
    plan: Plan,
    node_rank: int | None = None,
    milestones: dict[str, float] | None = None,
    fresh: bool = False,
    fresh_root: bool = False,
    join: bool = False,
    script_fresh: bool = False,
) -> None:
    """Hand the materialized run to the local launcher; map its outcome to an exit code.
    ``join``: this node joins a running elastic run (``dtrain agent --join``).
    ``fresh``: this start created ``run_dir`` (``fresh_root``: and its parent); a failure
    before the first step finished removes them (nothing was trained). ``script_fresh``: it
    created a script's run dir, removed only when no worker started (the script's own
    checkpoints may be there after)."""
    from dtrain_cli.launch import worker_server

    unstarted = fresh or script_fresh  # removed on a failure before launch_local
    if plan.nnodes == 1:
        hold_run_dir(run_dir)
    if problem := unwritable_checkpoints(run_dir, plan):
        fail([problem])
    try:
        print_warnings(plan.warnings)  # once, here: the workers read the plan, say none
        from dtrain_cli.plan.naming import run_label

        # a model without a recipe is named as its run dir is, not after gpt_tiny's values
        what = shlex.join(plan.script.argv()) if plan.script else run_label(cfg)
        console.print(
            f"[bold]dtrain[/] {escape(what)}: {plan.world_size} process(es) "
            f"({plan.mesh.label()}) on {plan.device}/{plan.backend} -> {run_dir}",
            highlight=False,
            soft_wrap=True,
        )
        from dtrain_cli.launch.local import launch_local, prepare_workers  # torch: in these

        prepare_workers(run_dir, cfg, plan)
        unstarted = fresh
        result = launch_local(
            run_dir,
            cfg,
            plan,
            node_rank,
            milestones,
            join=join,
            report=partial(report_failure, run_dir=run_dir, fresh=fresh, fresh_root=fresh_root),
        )
    except FileNotFoundError as exc:
        remove_if_untrained(run_dir, fresh, fresh_root)
        fail([str(exc)])
    except ConfigError as exc:
        remove_if_untrained(run_dir, fresh, fresh_root)
        fail(exc.problems)
    except BaseException:  # Ctrl-C before the workers started: nothing of this start stays
        if not remove_if_untrained(run_dir, unstarted, fresh_root) and plan.nnodes > 1:
            _say_kept(run_dir)
        raise
    finally:
        worker_server.stop()
    if not result.ok:
        gone = fresh or (script_fresh and not result.workers_started)
        report_failure(result, run_dir=run_dir, fresh=gone, fresh_root=fresh_root)
        if plan.nnodes > 1 and not result.workers_started:  # Ctrl-C at the rendezvous
            _say_kept(run_dir)
        raise typer.Exit(result.exit_code)
    if plan.script is not None:  # a recipe's end is its summary.json
        protocol.write_finished(RunDir(run_dir))
    console.print(f"[green]done[/]: {run_dir}", highlight=False, soft_wrap=True)


def _say_kept(run_dir: Path) -> None:
    """A multi-node start stopped before its workers: the run dir stays (the nodes share it,
    another may have written to it)."""
    err_console.print(
        f"kept {run_dir} (its nodes share it): the same command on each node starts the run again",
        highlight=False,
        soft_wrap=True,
    )


def hold_run_dir(run_dir: Path) -> None:
    """This launcher is the run dir's only one while it lives (a ``dtrain resume`` of a run
    still training started a second group there: each pruned the other's checkpoint)."""
    from dtrain_cli.rundir.lock import SCHEDULER_WAIT_S, RunInUse, hold

    try:
        hold(run_dir, SCHEDULER_WAIT_S if env.in_scheduler_job() else 0.0)
    except RunInUse as exc:  # held, in a job: a restart may find it free (not bad input)
        fail([str(exc)], 1 if exc.held and env.in_scheduler_job() else 2)


def unwritable_checkpoints(run_dir: Path, plan: Plan) -> str | None:
    """A run that will save checkpoints into a folder it cannot write (a read-only mount)
    trained up to its first save and lost it all; said before anything starts."""
    ck = plan.checkpoint
    if plan.script is not None or not (ck.steps or ck.every_minutes):
        return None
    folder = RunDir(run_dir).checkpoints
    where = folder if folder.exists() else run_dir
    if os.access(where, os.W_OK | os.X_OK):
        return None
    return (
        f"{folder}: cannot be written (read-only, or not this user's); the run's checkpoints "
        "go there: make it writable, or resume a copy of the run elsewhere"
    )


def report_failure(result: LaunchResult, *, run_dir: Path, fresh: bool, fresh_root: bool) -> None:
    """A launch that did not succeed: its one-line error, then where its logs are (or that
    its run dir was removed: nothing was trained)."""
    if console.is_terminal:  # the progress bar's line may be unfinished
        console.line()
    message, traceback = result.message, kept_traceback(run_dir, result.message)
    removed = result.exit_code != EXIT_PREEMPTED and remove_if_untrained(run_dir, fresh, fresh_root)
    if removed and traceback:  # its log is gone with the run dir: the traceback is here
        message = re.sub(r";? ?traceback in logs/rank_\d+\.log", "", message)
    # a preemption saved its checkpoint and ends to be requeued: not a failure
    said = "" if result.exit_code == EXIT_PREEMPTED else "[bold red]error:[/] "
    err_console.print(f"{said}{escape(message)}", highlight=False, markup=True, soft_wrap=True)
    if removed and traceback:
        err_console.print(traceback, highlight=False, markup=False, soft_wrap=True)
    if removed:
        how = "stopped" if result.exit_code == EXIT_INTERRUPTED else "failed"
        before = "its first step" if result.workers_started else "its workers started"
        err_console.print(
            f"removed {run_dir}: the run {how} before {before}", highlight=False, soft_wrap=True
        )
    else:
        err_console.print(f"logs: {run_dir / 'logs'}", highlight=False, soft_wrap=True)


def kept_traceback(run_dir: Path, message: str) -> str:
    """The last traceback of the rank log a report points to (``traceback in
    logs/rank_K.log``), read before a failed start's run dir is removed; "" for none."""
    found = re.search(r"traceback in (logs/rank_\d+\.log)", message)
    try:
        text = (run_dir / found.group(1)).read_text(errors="replace") if found else ""
    except OSError:
        return ""
    start = text.rfind("Traceback (most recent call last):")
    return text[start:].rstrip() if start >= 0 else ""


def remove_if_untrained(run_dir: Path, fresh: bool, fresh_root: bool = False) -> bool:
    """Remove a run dir this start created when no rank finished a training step; a run
    that trained keeps its logs. Returns whether it was removed."""
    if not fresh or not run_dir.is_dir() or protocol.trained(RunDir(run_dir)):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    if fresh_root:
        with contextlib.suppress(OSError):
            run_dir.parent.rmdir()  # only when empty
    return True
