"""dtrain sbatch against a real SLURM (slurmctld + 2 slurmd + munge on this machine), started
by tests/slurm/start-local-slurm.sh. In CI (CI=true) these tests must run: a SLURM that
cannot be started fails them; elsewhere they skip only when SLURM cannot be installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_PREEMPTIBLE, run_dtrain

pytestmark = pytest.mark.multiproc
SCRIPTS = Path(__file__).parents[1] / "slurm"
ROOT = os.environ.get("SLURM_LOCAL_ROOT", "/tmp/slurm")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
# A few seconds of training per job on 2 cores.
TINY = [*TINY_PREEMPTIBLE, "cluster.time=10"]
NASTY = "ref $(touch PWNED1) `touch PWNED2` it's"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"SLURM tests must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm():
    """A running 2-node local SLURM; stopped at the end if this session started it."""
    if os.geteuid() != 0:
        _unavailable("starting slurmctld/slurmd needs root")
    env = {**os.environ, "SLURM_LOCAL_NODES": "2", "SLURM_LOCAL_ROOT": ROOT}
    out = subprocess.run(
        ["bash", str(SCRIPTS / "start-local-slurm.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        text = out.stdout[-3000:] + out.stderr[-3000:]
        if "apt-get" in text and ("install failed" in text or "update failed" in text):
            _unavailable(f"SLURM packages cannot be installed here: {text[-500:]}")
        pytest.fail(f"start-local-slurm.sh failed:\n{text}")
    started = "nothing to do" not in out.stdout
    os.environ["SLURM_CONF"] = f"{ROOT}/etc/slurm.conf"
    os.environ["PATH"] = os.environ["PATH"] + ":/usr/sbin"
    yield
    if started:
        subprocess.run(
            ["bash", str(SCRIPTS / "stop-local-slurm.sh")],
            env=env,
            capture_output=True,
            timeout=120,
        )


def job_info(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_job(job_id: str, states: set[str], timeout: float = 180) -> dict[str, str]:
    deadline = time.time() + timeout
    info: dict[str, str] = {}
    while time.time() < deadline:
        info = job_info(job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(0.1)
    pytest.fail(f"job {job_id} not in {states} after {timeout} s: {info}")


def submit(cwd: Path, *overrides: str) -> tuple[str, Path]:
    run = run_dtrain(["sbatch", *overrides, "--submit"], cwd)
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.strip()
    assert job_id.isdigit(), run.stdout
    run_dir = Path(re.search(r"submitted job \d+: (.*)", run.stderr).group(1).strip())
    assert (run_dir / "slurm" / "job_id").read_text().strip() == job_id
    return job_id, run_dir


def release(job_id: str) -> None:
    """Skip SLURM's ~120 s hold on a requeued job (``StartTime=now``). Not within the
    same second as the requeue: slurmd refuses a start whose credential is not newer than
    the revoked one ("Job credential revoked")."""
    time.sleep(2.0)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)


def losses(run_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if r["kind"] == "train"]


@pytest.fixture(scope="session")
def reference(slurm, tmp_path_factory):
    """One node, uninterrupted; its run name tries to inject shell commands."""
    cwd = tmp_path_factory.mktemp("slurm-ref")
    job_id, run_dir = submit(cwd, *TINY, f'run.name="{NASTY}"')
    info = wait_job(job_id, TERMINAL)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    return job_id, run_dir, cwd, info


def test_submit_runs_to_completion_with_output_in_the_run_dir(reference):
    job_id, run_dir, cwd, info = reference
    assert run_dir.name == NASTY and info["JobName"] == "ref"  # scontrol -o splits at spaces
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert "step 300/300" in out and "dtrain: finished" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 300 and summary["world_size"] == 2
    assert (run_dir / "checkpoints" / "step_000300").is_dir()
    assert (run_dir / "slurm" / "FINISHED").is_file() and (
        run_dir / "slurm" / "job.sbatch"
    ).is_file()
    assert list(cwd.rglob("PWNED*")) == [] and list(run_dir.parent.rglob("PWNED*")) == []
    # sbatch --submit -> first training step, for the benchmark
    assert 0 < summary["startup_first_step_done_s"] < 60


def test_two_node_job_matches_the_single_node_run(reference, tmp_path):
    job_id, run_dir = submit(tmp_path, *TINY, "nodes=2", "cluster.cpus_per_task=1", "run.name=two")
    info = wait_job(job_id, TERMINAL)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert info["NumNodes"] == "2" and info["NodeList"] == "node[1-2]"
    plan = (run_dir / "plan.yaml").read_text()
    assert "nnodes: 2" in plan and "nproc_per_node: 1" in plan
    one, two = losses(reference[1]), losses(run_dir)
    assert len(one) == len(two) == 60
    for a, b in zip(one, two, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a)


def test_validate_cluster_as_a_two_node_job(slurm, tmp_path):
    run = run_dtrain(["sbatch", "--validate", "nodes=2", "--submit"], tmp_path)
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip()
    info = wait_job(job_id, TERMINAL)
    out = next(tmp_path.glob(f"runs/validate-*/slurm/job-{job_id}.out")).read_text()
    assert info["JobState"] == "COMPLETED" and info["NumNodes"] == "2", out
    assert out.count("validate-cluster: ok") == 2  # one report per node
    assert "node[1-2] -> node1, node2" in out and "all 2 ranks arrived" in out
    assert "all_reduce, 2 ranks" in out


def test_preemption_checkpoints_requeues_and_finishes_like_an_uninterrupted_run(
    reference, tmp_path
):
    job_id, run_dir = submit(tmp_path, *TINY, "run.name=preempted")
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert time.time() < deadline, job_info(job_id)
        time.sleep(0.05)
    # what --signal=B:USR1@N does before the time limit: signal the batch shell
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    # the job requeues itself: pending again (SLURM may show FAILED for a moment first)
    info = wait_job(job_id, {"PENDING"}, timeout=120)
    assert info["Restarts"] == "1", info
    marker = json.loads((run_dir / "preempted.json").read_text())
    step = marker["step"]
    assert step % 5 == 0 and step < 300
    assert (run_dir / "checkpoints" / f"step_{step:06d}").is_dir()
    release(job_id)
    info = wait_job(job_id, TERMINAL)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert "workers checkpoint and stop" in out and f"requeueing job {job_id}" in out
    assert "(restart 1)" in out and "dtrain: finished" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == f"step_{step:06d}"
    ref = json.loads((reference[1] / "summary.json").read_text())
    assert summary["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-6)
    assert losses(run_dir) == pytest.approx(losses(reference[1]), rel=1e-6)

    # A finished job that is requeued anyway (by an admin, or a late preemption) exits at
    # once: the FINISHED marker, not a second training run.
    before = metrics.read_text()
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    wait_job(job_id, {"PENDING"})
    release(job_id)
    deadline = time.time() + 120
    while "not running it again" not in (
        text := (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    ):
        assert time.time() < deadline, text[-2000:]
        time.sleep(0.1)
    assert wait_job(job_id, TERMINAL)["JobState"] == "COMPLETED"
    assert metrics.read_text() == before


@pytest.mark.parametrize("how", ["--batch", "--full"])
def test_two_node_preemption_requeues_whichever_process_gets_the_signal(how, reference, tmp_path):
    """``--batch``: the batch shell only (SLURM's --signal=B: before the time limit);
    ``--full``: the shell and every step's tasks (scancel --full, some sites' preemption).
    With --full a node's agent may exit 75 first and srun kills the other (143): the
    requeue rests on the run's preempted.json, not on srun's code."""
    job_id, run_dir = submit(
        tmp_path, *TINY, "nodes=2", "cluster.cpus_per_task=1", f"run.name=pre2{how[2:]}"
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert time.time() < deadline, job_info(job_id)
        time.sleep(0.05)
    subprocess.run(["scancel", how, "--signal=USR1", job_id], check=True)
    info = wait_job(job_id, {"PENDING"} | TERMINAL, timeout=120)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "PENDING" and info["Restarts"] == "1", out
    step = json.loads((run_dir / "preempted.json").read_text())["step"]
    assert (run_dir / "checkpoints" / f"step_{step:06d}").is_dir() and step < 300
    release(job_id)
    info = wait_job(job_id, TERMINAL)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert f"requeueing job {job_id}" in out and "dtrain: finished" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == f"step_{step:06d}"
    one, two = losses(reference[1]), losses(run_dir)
    assert len(one) == len(two) == 60
    for a, b in zip(one, two, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a)


def test_a_job_over_the_partition_is_said_at_submit(slurm, tmp_path):
    """SLURM accepts 4 nodes on a 2-node partition and leaves the job pending forever
    (PartitionNodeLimit): said at submit, with the way out (a user's find: silent before)."""
    args = [*TINY, "nodes=4", "dp=4", "train.global_batch_size=16"]
    run = run_dtrain(["sbatch", *args, "--submit"], tmp_path)
    job_id = run.stdout.strip()
    try:
        assert run.returncode == 0 and job_id.isdigit(), run.stdout + run.stderr
        said = " ".join(run.stderr.split())
        assert f"job {job_id} waits with reason Partition" in said, said
        assert "nodes=4" in said and f"scancel {job_id}" in said
    finally:
        if job_id.isdigit():
            subprocess.run(["scancel", job_id], check=False)
