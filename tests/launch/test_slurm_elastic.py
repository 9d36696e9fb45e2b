"""Elastic membership on a real SLURM (the local 2-node one of tests/launch/test_slurm.py): an
``nnodes=1:2`` job loses node 2 (every process of its task SIGKILLed, as on a node that
died), goes on on node 1, takes a ``dtrain sbatch --join`` job's node back, and finishes
with the curve and parameters of a run that never changed size."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import run_dtrain
from tests.launch.test_elastic_live import (  # noqa: F401
    SHAPE,
    assert_same_curve,
    changes,
    progress,
    reference,
)
from tests.launch.test_slurm import TERMINAL, job_info, slurm, submit, wait_job  # noqa: F401

pytestmark = pytest.mark.multiproc
ELASTIC = [
    *SHAPE,
    "nodes=1:2",
    "dp=2",
    "launcher.max_restarts=5",
    "launcher.node_timeout_s=3",
    "launcher.last_call_s=2",
    "cluster.time=10",
]
# slow enough for the drill to act while the run goes on (two nodes: 150 ms a step; the
# one node left waits for the join job's start-up: 2 s a step)
FAULTS = "throttle:ms=150:world=2,throttle:ms=2000:world=1"
TIMEOUT_S = 300


def task_pids(job_id: str, node_id: int) -> list[int]:
    """Every process of the job's task on one (fake) node: its agent, fork server, workers."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            env = dict(
                item.split("=", 1)
                for item in (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in item
            )
            if (
                env.get("SLURM_JOB_ID") == job_id
                and env.get("SLURM_NODEID") == str(node_id)
                and "SLURM_STEP_ID" in env
            ):
                pids.append(int(proc.name))
    return pids


def wait_for(what, deadline: float, label: str, job_id: str, run_dir: Path) -> None:
    while not what():
        state = job_info(job_id).get("JobState")
        if time.monotonic() > deadline or state in TERMINAL:
            out = "\n".join(p.read_text()[-3000:] for p in (run_dir / "slurm").glob("*.out"))
            pytest.fail(f"{label}: not reached (job {state}):\n{out}")
        time.sleep(0.2)


def test_an_elastic_job_loses_a_node_takes_one_back_and_keeps_the_curve(
    slurm,  # noqa: F811
    reference,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    monkeypatch.setenv("DTRAIN_FAULTS", FAULTS)  # sbatch exports it to the job's tasks
    job_id, run_dir = submit(tmp_path, *ELASTIC, "run.name=elastic")
    deadline = time.monotonic() + TIMEOUT_S
    on_two = lambda: (p := progress(run_dir)).get("world_size") == 2 and p["step"] >= 12  # noqa: E731
    wait_for(on_two, deadline, "step 12 on two nodes", job_id, run_dir)
    pids = task_pids(job_id, node_id=1)
    assert pids, "no process of node 2's task"
    for pid in pids:  # the node is lost: all its processes at once
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shrunk = lambda: any(c["new_world_size"] == 1 for c in changes(run_dir))  # noqa: E731
    wait_for(shrunk, deadline, "the group of one", job_id, run_dir)
    monkeypatch.delenv("DTRAIN_FAULTS")
    join = run_dtrain(["sbatch", "--join", str(run_dir), "nodes=1", "--submit"], tmp_path)
    assert join.returncode == 0, join.stderr
    join_id = join.stdout.strip()
    info = wait_job(job_id, TERMINAL, timeout=max(1.0, deadline - time.monotonic()))
    joined = wait_job(join_id, TERMINAL, timeout=60)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    join_out = (run_dir / "slurm" / f"join-{join_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert joined["JobState"] == "COMPLETED", join_out
    assert "dtrain: finished" in out and re.search(r"joins dtrain-\d+-0 at node1:\d+", join_out)
    summary = assert_same_curve(run_dir, reference)
    assert summary["world_size"] == 2 and summary["steps"] == 40
    sizes = [(c["old_world_size"], c["new_world_size"]) for c in summary["membership_changes"]]
    lost = sizes.index((2, 1))
    assert (1, 2) in sizes[lost + 1 :], sizes  # the join job's node came in after the loss
    for change in summary["membership_changes"]:
        assert change["steps_redone"] <= 5  # checkpoint every 5 steps
    # the group of one, stopped with SIGTERM for the join, checkpoints and leaves at once
    # (torch's worker wrapper would hold it until the agent's SIGKILL, 30 s later)
    grow = summary["membership_changes"][lost + 1 + sizes[lost + 1 :].index((1, 2))]
    assert grow["steps_redone"] == 0 and grow["took_s"] < 25, grow
