"""``dtrain agent RUN_DIR``: start this node's workers for a run dir that already exists.

    srun dtrain agent runs/exp1 --nnodes 2 --rdzv-endpoint node1:29500 --rdzv-id job42
    srun dtrain agent runs/exp1 --nnodes 1:4 --join --rdzv-endpoint node1:29500 --rdzv-id job42

What the ``dtrain sbatch`` script runs on every node: no composing, the run dir's
config.yaml and plan.yaml decide everything (the workers resume from its newest complete
checkpoint, so a requeued job continues). ``--init-from DIR`` (a ``dtrain k8s`` pod) first
copies config.yaml and plan.yaml from DIR, the mounted ConfigMap, into the run dir
(:mod:`dtrain_cli.launch.k8s.pod`). The node rank defaults to ``$SLURM_NODEID``;
``--join`` (a ``dtrain sbatch --join`` job's nodes) has none: such a node never hosts the
rendezvous. When this node's workers completed the run, ``slurm/FINISHED`` records it (the
batch script's test of success: an elastic job's srun reports a lost node's task).
Exit code 75 means preempted with a checkpoint saved.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import typer

from dtrain_cli.cli.common import err_console, fail
from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir


def agent(
    run_dir: Path = typer.Argument(..., help="A run dir with config.yaml and plan.yaml."),
    nnodes: str | None = typer.Option(None, "--nnodes", help="N or MIN:MAX; the plan's."),
    node_rank: int | None = typer.Option(None, "--node-rank", help="Default $SLURM_NODEID."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="node0 host:port."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Same on every node."),
    join: bool = typer.Option(False, "--join", help="Join a running elastic run (no rank)."),
    init_from: Path | None = typer.Option(
        None, "--init-from", help="Copy config.yaml, plan.yaml from here first (k8s pods)."
    ),
) -> None:
    """Start this node's workers for an existing run dir (what `dtrain sbatch` jobs run).

    Guide: docs/clusters.md
    """
    env.mark_launch_start()
    if init_from is not None:  # a Kubernetes pod: the run dir from the mounted ConfigMap
        from dtrain_cli.launch.k8s.pod import init_run_dir

        if problems := init_run_dir(run_dir.resolve(), init_from):
            fail(problems)
    if RunDir(run_dir).slurm_finished.exists():  # as the SLURM job script checks it
        # a pod started again on a finished run (a JobSet applied again, a restart after
        # completion) resumed at the last step and wrote a summary of nulls over the run's
        err_console.print(
            f"dtrain: {run_dir} already finished (slurm/FINISHED); not running it again",
            highlight=False,
            soft_wrap=True,
        )
        return
    from dtrain_cli.launch import worker_server
    from dtrain_cli.launch.preload import SCRIPT_FIRST, WORKER_FIRST

    # imports torch on another core while we read the run dir (for your own script: torch,
    # not dtrain's trainer; plan.yaml's "script:" line says which, read without YAML)
    worker_server.start(first=SCRIPT_FIRST if is_script_run(run_dir) else WORKER_FIRST)
    from dtrain_cli.config.compose import config_from_yaml
    from dtrain_cli.launch.multinode import NodeArgs, apply_node_args, parse_nnodes
    from dtrain_cli.plan.plan import Plan

    run_dir = run_dir.resolve()
    run = RunDir(run_dir)
    if not run.is_run():
        fail([f"{run_dir}: not a run dir (no config.yaml/plan.yaml); see `dtrain sbatch`"])
    cfg = config_from_yaml(run.config)
    plan = Plan.load(run.plan)
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
    if not join and node_rank is None:
        node_rank = env.scheduler_node_rank()
    problems += apply_node_args(cfg, NodeArgs(plan.nnodes, node_rank, rdzv_endpoint, rdzv_id))
    if problems:
        fail(problems)
    from dtrain_cli.cli.launch_cmd import start_workers

    plan = threads_of_this_node(cfg, plan)
    start_workers(run_dir, cfg, plan, node_rank, join=join)  # exits non-zero on failure
    protocol.mark_finished(run)


def threads_of_this_node(cfg: Any, plan: Any) -> Any:
    """The plan's threads per rank, from this node's cores: a job's plan was made where it
    was submitted (a login node's 2 or 64 cores, not the 1 or 16 the job was given here: 2
    threads a rank on 1 CPU ran 7-20x slower). Kept when launcher.threads_per_proc or the
    job's OMP_NUM_THREADS says otherwise, and outside SLURM (a pod's CPU limit is a quota,
    which the affinity mask does not show)."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    given = cfg.launcher.threads_per_proc or (omp.isdigit() and int(omp) > 0)
    # cluster.cpus_per_task: the plan was made with the job's CPUs already
    if given or cfg.cluster.cpus_per_task or "SLURM_JOB_ID" not in os.environ:
        return plan
    try:
        cores = len(os.sched_getaffinity(0))  # the job's CPUs (SLURM's cgroup, cpuset)
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    on_node = os.environ.get("SLURM_CPUS_ON_NODE", "")
    if on_node.isdigit() and int(on_node) > 0:  # a cluster that binds no CPUs: its count
        cores = min(cores, int(on_node))
    threads = max(1, cores // max(plan.nproc_per_node, 1))
    return dataclasses.replace(plan, threads_per_proc=threads)


def is_script_run(run_dir: Path) -> bool:
    try:
        text = RunDir(run_dir).plan.read_text()
    except OSError:
        return False
    return re.search(r"^script:[ \t]*$", text, re.MULTILINE) is not None
