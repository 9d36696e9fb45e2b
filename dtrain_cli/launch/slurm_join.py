"""Nodes that join a running elastic SLURM job: ``dtrain sbatch --join RUN_DIR``. Torch-free.

    dtrain sbatch recipe=gpt_small parallel.nnodes=1:4 dp=8 --submit   # the run, on 1-4 nodes
    dtrain sbatch --join runs/<run> nodes=2 --submit                    # 2 more nodes join

SLURM cannot add nodes to a running job, so capacity that comes back (a node repaired, a
partition freed) joins as a job of its own: each of its nodes runs ``dtrain agent RUN_DIR
--join`` against the rendezvous the run's current attempt wrote to ``slurm/rendezvous``
(read when the join job starts, not when it is submitted, so it finds a requeued attempt
too). torch's elastic agents admit it at their next restart point; the workers re-derive
their layout for the larger world and resume from the newest checkpoint. The join job
ends when the run does (or when its nodes are lost again: the run goes on without them).
Its output goes to ``slurm/join-<jobid>.out``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.launch.slurm import (
    FINISHED,
    RENDEZVOUS,
    SbatchJob,
    comment_text,
    header_lines,
    setup_lines,
    srun_cpus,
)
from dtrain_cli.plan.plan import Plan

JOIN_SCRIPT = "join.sbatch"


def join_problems(plan: Plan, nnodes: int) -> list[str]:
    """Why these nodes cannot join this run (one line each)."""
    if plan.elastic is None:
        return [
            f"--join: the run is not elastic (parallel.nnodes={plan.nnodes}); nodes can join "
            "a run launched with parallel.nnodes=MIN:MAX"
        ]
    low, high = plan.elastic.min_nnodes, plan.elastic.max_nnodes
    if not 1 <= nnodes <= high - 1:
        return [
            f"nodes={nnodes}: a join job adds 1 to {high - 1} node(s) to a run on "
            f"{low}-{high} nodes (the run keeps at least one)"
        ]
    return []


def join_job(
    cfg: DtrainConfig,
    plan: Plan,
    run_dir: Path,
    nnodes: int,
    python: str,
    workdir: Path,
) -> SbatchJob:
    c = cfg.cluster
    assert plan.elastic is not None
    return SbatchJob(
        run_dir=run_dir,
        job_name=f"{run_dir.name}-join",
        nnodes=nnodes,
        nproc_per_node=plan.nproc_per_node,
        python=c.python or python,
        workdir=workdir,
        cluster=c,
        node_command=[
            "agent",
            str(run_dir),
            "--nnodes",
            f"{plan.elastic.min_nnodes}:{plan.elastic.max_nnodes}",
            "--join",
        ],
        summary=f"{nnodes} node(s) join run {run_dir.name} ({plan.recipe})",
        requeue=False,
        preemptible=False,  # a preempted join node is a lost node: the run goes on
    )


def render_join_sbatch(job: SbatchJob) -> str:
    """The join job's script. Pure (same job, same bytes)."""
    q = shlex.quote
    node_cmd = " ".join(q(a) for a in job.node_command)
    header = [
        line.replace("/slurm/job-%j.out", "/slurm/join-%j.out")
        for line in header_lines(job)
        if not line.startswith("#SBATCH --signal")
    ]
    lines = [
        "#!/bin/bash",
        f"# dtrain sbatch --join: {comment_text(job.summary)}",
        *header,
        "#SBATCH --no-kill",
        *setup_lines(job),
        "",
        f'if [ -e "{FINISHED}" ]; then',
        '  echo "dtrain: $RUN_DIR already finished; nothing to join"',
        "  exit 0",
        "fi",
        f'if ! read -r RDZV_ENDPOINT RDZV_ID < "{RENDEZVOUS}"; then',
        f'  echo "dtrain: {RENDEZVOUS} is missing: the run\'s job has not started yet"',
        "  exit 1",
        "fi",
        'echo "dtrain: job $SLURM_JOB_ID joins $RDZV_ID at $RDZV_ENDPOINT with'
        ' $SLURM_JOB_NUM_NODES node(s)"',
        f"srun --export=ALL --ntasks-per-node=1 {srun_cpus(job)}--no-kill --kill-on-bad-exit=0 "
        f'"$PYTHON" -m dtrain_cli {node_cmd} \\',
        '  --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RDZV_ID"',
        "rc=$?",
        f'if [ "$rc" -eq 0 ] || [ -e "{FINISHED}" ]; then',
        '  echo "dtrain: the run finished"',
        "  exit 0",
        "fi",
        'echo "dtrain: srun exited with $rc"',
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)
