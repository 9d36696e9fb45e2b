"""``dtrain sbatch ... -- script.py`` on the local 2-node SLURM (tests/launch/test_slurm.py starts
it): the plain DDP script on 2 nodes, and a script that saves on USR1, exits 75 and is
requeued."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_dtrain
from tests.launch.test_slurm import TERMINAL, job_info, release, slurm, wait_job  # noqa: F401

pytestmark = pytest.mark.multiproc
SCRIPTS = REPO / "tests" / "scripts"
ENV = {"PYTHONPATH": f"{REPO}:{SCRIPTS}"}


def submit_script(cwd: Path, overrides: list[str], script: list[str]) -> tuple[str, Path]:
    args = ["sbatch", *overrides, "cluster.time=10", "--submit", "--", *script]
    run = run_dtrain(args, cwd, env=ENV)
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.strip()
    run_dir = Path(re.search(r"submitted job \d+: (.*)", run.stderr).group(1).strip())
    return job_id, run_dir


def test_ddp_script_on_two_nodes(slurm, tmp_path):  # noqa: F811
    script = [str(SCRIPTS / "ddp_plain.py"), "--steps", "5", "--out", "result.json"]
    job_id, run_dir = submit_script(
        tmp_path, ["nodes=2", "dp=2", "cluster.cpus_per_task=1"], [*script, "--dump", "dump"]
    )
    info = wait_job(job_id, TERMINAL)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["NumNodes"] == "2", out
    assert "dtrain: finished" in out
    assert json.loads((tmp_path / "result.json").read_text())["world"] == 2
    groups = set()
    for rank in range(2):
        env = json.loads((tmp_path / "dump" / f"rank_{rank}.json").read_text())["env"]
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("2", "1")
        groups.add(env["GROUP_RANK"])
        assert "first step done" in (run_dir / "logs" / f"rank_{rank}.log").read_text()
    assert groups == {"0", "1"}  # one rank on each node


def test_script_that_exits_75_is_requeued(slurm, tmp_path):  # noqa: F811
    out_dir = tmp_path / "out"
    job_id, run_dir = submit_script(
        tmp_path, ["dp=1"], ["-m", "probepkg.probe", "preempt", str(out_dir)]
    )
    deadline = time.time() + 120
    while not (out_dir / "pid_rank_0").exists():
        assert time.time() < deadline, job_info(job_id)
        time.sleep(0.1)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    info = wait_job(job_id, {"PENDING"}, timeout=120)
    assert info["Restarts"] == "1", info
    assert json.loads((run_dir / "preempted.json").read_text())["by"] == "script"
    assert (out_dir / "checkpoint_rank_0").is_file()
    release(job_id)
    info = wait_job(job_id, TERMINAL)
    out = (run_dir / "slurm" / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert f"requeueing job {job_id}" in out and "dtrain: finished" in out
    assert json.loads((out_dir / "resumed_rank_0").read_text()) == {"restart": "1"}
