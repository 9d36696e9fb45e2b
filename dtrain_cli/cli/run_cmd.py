"""``dtrain run train.py``: your own training script with dtrain's plan, agent, logs and SLURM.

    dtrain run train.py --epochs 3                                   # 1 process per device
    dtrain run dp=4 launcher.max_restarts=2 -- train.py --epochs 3   # overrides, then the script
    dtrain run dp=2 -m mypkg.train --lr 1e-3                         # a module, as python -m
    dtrain run recipe=my_script_recipe --config-dir .                # a recipe names the script
    dtrain run --validate-cluster dp=2 -- train.py                   # live collective check first

Overrides (and the options below) come first; the script starts at ``--``, ``-m`` or the
first ``*.py`` token, and everything from there is the script's own ``sys.argv``. The run
is ``dtrain launch``'s (:func:`dtrain_cli.cli.launch_cmd.start_run`): plan, run dir, the
elastic agent with every variable torchrun sets, restarts, per-rank logs, the failing
rank's traceback, Ctrl-C, preemption; only the workers run the script instead of the
trainer (:mod:`dtrain_cli.runtime.script.worker`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dtrain_cli.cli.common import CONFIG_DIR_HELP, fail
from dtrain_cli.rundir import env

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.plan.plan import Plan

RUN_SETTINGS = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,  # the script's own options are not ours
}
# Options that may also come after the overrides (before the script): name -> takes a value
LATE_OPTIONS = {
    "--config-dir": True,
    "-c": True,
    "--nnodes": True,
    "--node-rank": True,
    "--rdzv-endpoint": True,
    "--rdzv-id": True,
    "--validate-cluster": False,
}


def run(
    ctx: typer.Context,
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    nnodes: str | None = typer.Option(
        None, "--nnodes", help="Nodes: N, or MIN:MAX (elastic); run on each node."
    ),
    node_rank: int | None = typer.Option(None, "--node-rank", help="This node: 0 hosts rdzv."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="node0 host:port."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Same on every node; run name."),
    validate_cluster: bool = typer.Option(
        False, "--validate-cluster", help="Run the live collective check first."
    ),
) -> None:
    """Run your own training script on every rank: [OVERRIDES] [--] SCRIPT.py|-m MODULE [ARGS].

    The script runs under dtrain's own python; launcher.python=PATH runs it under another's.

    A script gets no hang limit: debug.collective_timeout_s watches dtrain's trainer only.

    Guide: docs/own-script.md
    """
    env.mark_launch_start()
    from dtrain_cli.launch.signals import watch_interrupt

    watch_interrupt()
    try:
        _run(ctx.args, config_dir, nnodes, node_rank, rdzv_endpoint, rdzv_id, validate_cluster)
    except KeyboardInterrupt:
        fail(["stopped by SIGINT before the workers started"], 130)


def _run(
    args: list[str],
    config_dir: list[Path],
    nnodes: str | None,
    node_rank: int | None,
    rdzv_endpoint: str | None,
    rdzv_id: str | None,
    validate_cluster: bool,
) -> None:
    from dtrain_cli.cli.script_args import split_script
    from dtrain_cli.launch import worker_server

    takes_value = [name for name, has_value in LATE_OPTIONS.items() if has_value]
    tokens, script = split_script(args, bare_is_script=True, value_options=takes_value)
    from dtrain_cli.launch.preload import SCRIPT_FIRST

    worker_server.start(tokens, SCRIPT_FIRST)  # imports torch on another core meanwhile
    overrides, late, problems = parse_late_options(tokens)
    if problems:
        fail(problems)
    dirs = [*config_dir, *(Path(p) for p in late.get("--config-dir", []) + late.get("-c", []))]

    def last(name: str, value: str | None) -> str | None:
        return late[name][-1] if late.get(name) else value

    rank = last("--node-rank", None if node_rank is None else str(node_rank))
    if rank is not None and not rank.lstrip("-").isdigit():
        fail([f"--node-rank={rank}: not a number; use 0 .. nnodes-1"])
    check = validate_cluster or "--validate-cluster" in late
    from dtrain_cli.cli.launch_cmd import start_run

    start_run(
        overrides,
        dirs,
        last("--nnodes", nnodes),
        None if rank is None else int(rank),
        last("--rdzv-endpoint", rdzv_endpoint),
        last("--rdzv-id", rdzv_id),
        script=script,
        before_start=lambda cfg, plan: before_start(cfg, plan, check),
    )


def before_start(cfg: DtrainConfig, plan: Plan, check: bool) -> None:
    """Once the plan is checked: a script to run (the command line's or the recipe's),
    and with ``--validate-cluster`` the cluster check, before anything is written."""
    if plan.script is None:
        fail(
            [
                "no script: name it after the overrides, e.g. dtrain run dp=2 -- train.py ARGS "
                "(or -m mypkg.train, or a recipe that sets script.path)"
            ]
        )
    if check:
        cluster_check(cfg, plan)


def parse_late_options(tokens: list[str]) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """Overrides, and dtrain's options among them (``--nnodes 2``, ``--nnodes=2``)."""
    overrides: list[str] = []
    found: dict[str, list[str]] = {}
    problems: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name, eq, value = tok.partition("=")
        if not tok.startswith("-"):
            overrides.append(tok)
        elif LATE_OPTIONS.get(name):
            if not eq:
                if i + 1 >= len(tokens):
                    problems.append(f"{name}: needs a value")
                    break
                i, value = i + 1, tokens[i + 1]
            found.setdefault(name, []).append(value)
        elif tok in LATE_OPTIONS:
            found.setdefault(tok, []).append("")
        else:
            problems.append(
                f"{tok}: not an option of dtrain run ({', '.join(k for k in LATE_OPTIONS)}); "
                "the script's own options go after the script: dtrain run -- train.py " + tok
            )
        i += 1
    return overrides, found, problems


def cluster_check(cfg: DtrainConfig, plan: Plan) -> None:
    """``--validate-cluster``: the live collective check on the run's layout, then the run;
    exit 1 (nothing started, no run dir) when a check fails."""
    from dtrain_cli.cli.validate_cmd import DEFAULT_SIZES, check_cluster, parse_size, show
    from dtrain_cli.launch import worker_server
    from dtrain_cli.launch.preload import worker_modules

    worker_server.announce(worker_modules(Path(cfg.run.root), cfg, plan))  # server: ready
    lc = cfg.launcher
    multi = plan.nnodes > 1
    with contextlib.suppress(OSError):  # one that cannot be made: the check says so
        Path(cfg.run.root).mkdir(parents=True, exist_ok=True)
    report = check_cluster(
        nnodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        node_rank=None,
        rdzv_endpoint=lc.rdzv_endpoint if multi else None,
        rdzv_id=f"{lc.rdzv_id}-validate" if multi and lc.rdzv_id else None,
        backend=plan.backend,
        run_dir=Path(cfg.run.root),
        timeout=min(60.0, float(lc.rdzv_timeout_s)),
        sizes=[parse_size(s) for s in DEFAULT_SIZES.split(",")],
    )
    show(report)
    if not report["ok"]:
        fail(["validate-cluster failed (see the table); the script was not started"], 1)
