"""Elastic SLURM jobs under bash with stand-ins for srun/scontrol (no SLURM): the run's own
record (``slurm/FINISHED``) decides success; a ``dtrain sbatch --join`` job joins the
attempt that is running; the agent checks the node range. The script as text and --join's
refusals: tests/unit/test_slurm_elastic_script.py; the live drill:
tests/launch/test_slurm_elastic.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_cli.cli.sbatch_cmd import build_job
from dtrain_cli.launch.rundir import materialize
from dtrain_cli.launch.slurm import render_sbatch
from tests.launch.test_slurm_script import stub
from tests.unit.test_slurm_elastic_script import ELASTIC, make_elastic_run, sbatch_join


def dtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dtrain_cli", *args], cwd=cwd, capture_output=True, text=True
    )


def run_script(text: str, tmp_path: Path, srun_body: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub(bin_dir, "scontrol", '[ "$1" = show ] && echo node1; exit 0')
    stub(bin_dir, "srun", f'printf "%s\\n" "$@" > {tmp_path}/srun.argv; {srun_body}')
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_NUM_NODES": "1",
    }
    return subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True)


@pytest.fixture
def elastic_run(tmp_path: Path) -> Path:
    return make_elastic_run(tmp_path)


@pytest.mark.parametrize(
    "srun_body, rc, finished",
    [
        # node 2 was lost (its task SIGKILLed); node 1's agent completed the run
        ('date > "$(dirname "$0")/../runs/exp1/slurm/FINISHED"; exit 137', 0, True),
        ("exit 0", 0, True),
        ("exit 137", 137, False),  # the run did not complete: srun's code stands
    ],
)
def test_success_rests_on_the_runs_record_not_on_sruns_code(
    srun_body, rc, finished, tmp_path, elastic_run
):
    built = build_job(ELASTIC, [], run_dir=elastic_run, python="/p", workdir=tmp_path)
    out = run_script(render_sbatch(built.job), tmp_path, srun_body)
    assert out.returncode == rc, out.stdout + out.stderr
    assert (elastic_run / "slurm" / "FINISHED").exists() is finished
    assert ("dtrain: finished" in out.stdout) is finished
    # this attempt's rendezvous, for join jobs
    assert (elastic_run / "slurm" / "rendezvous").read_text() == "node1:20042 dtrain-42-0\n"
    argv = (tmp_path / "srun.argv").read_text().splitlines()
    assert argv[argv.index("--rdzv-id") + 1] == "dtrain-42-0"


def test_a_join_job_joins_the_running_attempt(tmp_path, elastic_run):
    code, text = sbatch_join(str(elastic_run), "nodes=1", "--dry-run")
    assert code == 0, text
    assert "#SBATCH --nodes=1\n" in text and "#SBATCH --no-requeue" in text
    assert f"--output={elastic_run}/slurm/join-%j.out" in text and "--signal" not in text
    # before the run's job started: nothing to join
    missing = run_script(text, tmp_path, "exit 0")
    assert missing.returncode == 1 and "has not started yet" in missing.stdout
    assert not (tmp_path / "srun.argv").exists()
    (elastic_run / "slurm" / "rendezvous").write_text("node1:20042 dtrain-42-3\n")
    joined = run_script(text, tmp_path, "exit 0")
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "joins dtrain-42-3 at node1:20042" in joined.stdout
    argv = (tmp_path / "srun.argv").read_text().splitlines()
    agent = argv[argv.index("agent") :]
    assert agent == [
        "agent",
        str(elastic_run),
        "--nnodes",
        "1:2",
        "--join",
        "--rdzv-endpoint",
        "node1:20042",
        "--rdzv-id",
        "dtrain-42-3",
    ]
    assert "--kill-on-bad-exit=0" in argv and "--no-kill" in argv
    # the rendezvous closed because the run completed: the join job succeeded too
    (elastic_run / "slurm" / "FINISHED").write_text("done\n")
    late = run_script(text, tmp_path, "exit 1")
    assert late.returncode == 0 and "already finished" in late.stdout


def test_the_agent_checks_the_node_range_and_join(tmp_path, elastic_run):
    wrong = dtrain("agent", str(elastic_run), "--nnodes", "2", cwd=tmp_path)
    assert wrong.returncode == 2 and "the run's plan is for 1:2 node(s)" in wrong.stderr
    both = dtrain("agent", str(elastic_run), "--join", "--node-rank", "1", cwd=tmp_path)
    assert both.returncode == 2 and "a joining node has no rank of its own" in both.stderr
    fixed = tmp_path / "runs" / "fixed"
    built = build_job(["recipe=gpt_tiny"], [], run_dir=fixed, workdir=tmp_path)
    materialize(built.cfg, built.plan, fixed)
    alone = dtrain("agent", str(fixed), "--join", cwd=tmp_path)
    assert alone.returncode == 2 and "is not an elastic run" in alone.stderr
