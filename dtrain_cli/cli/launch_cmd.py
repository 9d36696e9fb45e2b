"""``dtrain launch recipe=gpt_small dp=2``: compose -> plan -> run dir -> workers."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

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
)
from dtrain_cli.config.errors import ConfigError
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan


def launch(
    overrides: list[str] = typer.Argument(
        None, help=OVERRIDES_HELP, autocompletion=complete_override
    ),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    nnodes: str | None = typer.Option(None, "--nnodes", help="Nodes (N); run on each node."),
    node_rank: int | None = typer.Option(None, "--node-rank", help="This node: 0 hosts rdzv."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="node0 host:port."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Same on every node; run name."),
) -> None:
    """Train: compose the recipe, save config.yaml + plan.yaml in a new run dir, start workers."""
    os.environ.setdefault("DTRAIN_LAUNCH_T0", repr(time.time()))
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
    from dtrain_cli.launch.multinode import NodeArgs, apply_node_args, join_run_dir, parse_nnodes

    count, problems = parse_nnodes(nnodes)
    extra = [f"parallel.nnodes={count}"] if count else []
    if problems:
        fail(problems)
    cfg, plan = compose_and_plan([*overrides, *extra], config_dirs, script)
    composed = time.time()
    problems = apply_node_args(cfg, NodeArgs(count, node_rank, rdzv_endpoint, rdzv_id))
    if problems:
        fail(problems)
    if before_start is not None:
        before_start(cfg, plan)
    if plan.script is None:  # a script's data is its own
        prepare_data(cfg)
    from dtrain_cli.launch.rundir import materialize

    try:
        run_dir = join_run_dir(cfg, plan) if plan.nnodes > 1 else materialize(cfg, plan)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        fail([f"run.root={cfg.run.root}: cannot create the run directory ({why})"])
    start_workers(run_dir, cfg, plan, node_rank, {"composed": composed})


def prepare_data(cfg: DtrainConfig) -> None:
    """Tokenize/cache the corpus, or build and check a custom dataset, before the run dir
    exists: a problem found here leaves nothing behind."""
    from dtrain_cli.runtime.data import prepare_corpus

    try:
        prepare_corpus(cfg.data, cfg.train.seed, getattr(cfg.model, "vocab_size", None))
    except (ConfigError, FileNotFoundError) as exc:
        fail(exc.problems if isinstance(exc, ConfigError) else [str(exc)])


def start_workers(
    run_dir: Path,
    cfg: DtrainConfig,
    plan: Plan,
    node_rank: int | None = None,
    milestones: dict[str, float] | None = None,
) -> None:
    """Hand the materialized run to the local launcher; map its outcome to an exit code."""
    for w in plan.warnings:  # once, here: the workers read the plan and do not repeat them
        err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    what = shlex.join(plan.script.argv()) if plan.script else plan.recipe
    console.print(
        f"[bold]dtrain[/] {escape(what)}: {plan.world_size} process(es) ({plan.mesh.label()}) "
        f"on {plan.device}/{plan.backend} -> {run_dir}",
        highlight=False,
    )
    from dtrain_cli.launch import worker_server
    from dtrain_cli.launch.local import launch_local, prepare_workers

    prepare_workers(run_dir, cfg, plan)
    try:
        result = launch_local(run_dir, cfg, plan, node_rank, milestones)
    except FileNotFoundError as exc:
        fail([str(exc)])
    except ConfigError as exc:
        fail(exc.problems)
    finally:
        worker_server.stop()
    if not result.ok:
        err_console.print(
            f"[bold red]error:[/] {escape(result.message)}",
            highlight=False,
            markup=True,
            soft_wrap=True,
        )
        err_console.print(f"logs: {run_dir / 'logs'}", highlight=False)
        raise typer.Exit(result.exit_code)
    console.print(f"[green]done[/]: {run_dir}", highlight=False)
