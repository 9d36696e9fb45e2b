"""``dtrain agent RUN_DIR``: start this node's workers for a run dir that already exists.

    srun dtrain agent runs/exp1 --nnodes 2 --rdzv-endpoint node1:29500 --rdzv-id job42
    srun dtrain agent runs/exp1 --nnodes 1:4 --join --rdzv-endpoint node1:29500 --rdzv-id job42

What the ``dtrain sbatch`` script runs on every node: no composing, the run dir's
config.yaml and plan.yaml decide everything (the workers resume from its newest complete
checkpoint, so a requeued job continues). The node rank defaults to ``$SLURM_NODEID``;
``--join`` (a ``dtrain sbatch --join`` job's nodes) has none: such a node never hosts the
rendezvous. When this node's workers completed the run, ``slurm/FINISHED`` records it (the
batch script's test of success: an elastic job's srun reports a lost node's task).
Exit code 75 means preempted with a checkpoint saved.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import typer

from dtrain_cli.cli.common import fail


def agent(
    run_dir: Path = typer.Argument(..., help="A run dir with config.yaml and plan.yaml."),
    nnodes: str | None = typer.Option(None, "--nnodes", help="N or MIN:MAX; the plan's."),
    node_rank: int | None = typer.Option(None, "--node-rank", help="Default $SLURM_NODEID."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="node0 host:port."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Same on every node."),
    join: bool = typer.Option(False, "--join", help="Join a running elastic run (no rank)."),
) -> None:
    """Start this node's workers for an existing run dir (what `dtrain sbatch` jobs run).

    Guide: docs/clusters.md
    """
    os.environ.setdefault("DTRAIN_LAUNCH_T0", repr(time.time()))
    from dtrain_cli.launch import worker_server
    from dtrain_cli.runtime.preload import SCRIPT_FIRST, WORKER_FIRST

    # imports torch on another core while we read the run dir (for your own script: torch,
    # not dtrain's trainer; plan.yaml's "script:" line says which, read without YAML)
    worker_server.start(first=SCRIPT_FIRST if is_script_run(run_dir) else WORKER_FIRST)
    from dtrain_cli.config.compose import config_from_yaml
    from dtrain_cli.launch.multinode import NodeArgs, apply_node_args, parse_nnodes
    from dtrain_cli.launch.slurm import FINISHED
    from dtrain_cli.plan.plan import Plan

    run_dir = run_dir.resolve()
    if not (run_dir / "plan.yaml").is_file() or not (run_dir / "config.yaml").is_file():
        fail([f"{run_dir}: not a run dir (no config.yaml/plan.yaml); see `dtrain sbatch`"])
    cfg = config_from_yaml(run_dir / "config.yaml")
    plan = Plan.load(run_dir / "plan.yaml")
    counts, problems = parse_nnodes(nnodes)
    planned = (plan.elastic.min_nnodes, plan.nnodes) if plan.elastic else (plan.nnodes,) * 2
    if counts is not None and counts != planned:
        low, high = planned
        want = str(low) if low == high else f"{low}:{high}"
        fail([f"--nnodes={nnodes}: the run's plan is for {want} node(s)"])
    if join and plan.elastic is None:
        problems.append(f"--join: {run_dir} is not an elastic run (parallel.nnodes=MIN:MAX)")
    if join and node_rank is not None:
        problems.append("--join and --node-rank: a joining node has no rank of its own")
    if not join and node_rank is None and os.environ.get("SLURM_NODEID", "").isdigit():
        node_rank = int(os.environ["SLURM_NODEID"])
    problems += apply_node_args(cfg, NodeArgs(plan.nnodes, node_rank, rdzv_endpoint, rdzv_id))
    if problems:
        fail(problems)
    from dtrain_cli.cli.launch_cmd import start_workers

    start_workers(run_dir, cfg, plan, node_rank, join=join)  # exits non-zero on failure
    (run_dir / "slurm").mkdir(exist_ok=True)
    if not (run_dir / "slurm" / FINISHED).exists():
        (run_dir / "slurm" / FINISHED).write_text(time.strftime("%c\n"))


def is_script_run(run_dir: Path) -> bool:
    try:
        text = (run_dir / "plan.yaml").read_text()
    except OSError:
        return False
    return re.search(r"^script:[ \t]*$", text, re.MULTILINE) is not None
