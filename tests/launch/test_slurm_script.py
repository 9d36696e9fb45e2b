"""The sbatch script run under bash with stand-ins for srun, scontrol and sbatch (no SLURM
needed): quoting against shell injection, requeue on the preemption marker, a failed submit;
and the dry run imports no torch (a fresh interpreter). The script as text:
tests/unit/test_slurm_script.py."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_cli.cli.sbatch_cmd import build_job
from dtrain_cli.launch.slurm import render_sbatch

NASTY = "x$(touch PWNED1)`touch PWNED2`'\"q;touch PWNED3"


def stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def test_no_value_reaches_the_shell_unquoted(tmp_path):
    """Every string field holds $(...), backticks, quotes and ';': running the script
    creates no file, and srun receives the values byte for byte."""
    run_dir = tmp_path / f"runs {NASTY}"
    (run_dir / "slurm").mkdir(parents=True)
    python = str(tmp_path / f"py {NASTY}")
    workdir = tmp_path / f"wd {NASTY}"
    workdir.mkdir()
    built = build_job(
        [
            "recipe=gpt_tiny",
            "dp=2",
            f"cluster.partition='{NASTY.replace(chr(39), '')}'",
            f"cluster.account='{NASTY.replace(chr(39), '')}'",
            f"cluster.qos='{NASTY.replace(chr(39), '')}'",
            "+cluster.env.A='$(touch PWNED4)`touch PWNED5`'",
            "cluster.sbatch_args=['--comment=$(touch PWNED6)']",
        ],
        [],
        run_dir=run_dir,
        python=python,
        workdir=workdir,
    )
    assert built.problems == []
    script = render_sbatch(built.job)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir, "scontrol", "echo node1")
    record = f'pwd > {shlex.quote(str(tmp_path / "cwd"))}; printf "%s\\n" "$@" > '
    stub(bin_dir, "srun", record + f"{shlex.quote(str(tmp_path / 'argv'))}; exit 0")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node1",
    }
    out = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(tmp_path.rglob("PWNED*")) == []
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index(python) + 4] == str(run_dir)  # python -m dtrain_cli agent RUN_DIR
    assert "--rdzv-endpoint" in argv and "node1:20042" in argv
    assert (tmp_path / "cwd").read_text().strip() == str(workdir)
    assert (run_dir / "slurm" / "FINISHED").is_file()
    assert "export A='$(touch PWNED4)`touch PWNED5`'" in script


def test_sbatch_dry_run_does_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from dtrain_cli.cli.app import app\n"
        "try:\n"
        "    app(['sbatch', 'recipe=gpt_small', 'nodes=2', 'gpus_per_node=8', '--dry-run'])\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print('TORCH_LOADED' if 'torch' in sys.modules else 'NO_TORCH')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "#SBATCH --gpus-per-node=8" in out.stdout
    assert out.stdout.strip().endswith("NO_TORCH")


@pytest.mark.parametrize(
    "srun_body, stale_marker, requeued, rc",
    [
        # node 2 exited 75 first; --kill-on-bad-exit killed node 1's task: srun says 143
        ('touch "$RUN_DIR_T/preempted.json"; exit 143', False, True, 0),
        ('touch "$RUN_DIR_T/preempted.json"; exit 75', False, True, 0),
        ("exit 143", False, False, 143),  # killed without a checkpoint: not a preemption
        ("exit 1", True, False, 1),  # a marker from an earlier attempt does not count
    ],
)
def test_requeue_rests_on_the_preemption_marker_not_on_srun_exit_code(
    srun_body, stale_marker, requeued, rc, tmp_path
):
    run_dir = tmp_path / "runs" / "exp1"
    (run_dir / "slurm").mkdir(parents=True)
    if stale_marker:
        (run_dir / "preempted.json").write_text("{}")
    built = build_job(
        ["recipe=gpt_tiny", "nodes=2", "dp=2"], [], run_dir=run_dir, python="/p", workdir=tmp_path
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    stub(bin_dir, "scontrol", f'echo "$@" >> {calls}; [ "$1" = show ] && echo node1; exit 0')
    stub(bin_dir, "srun", srun_body)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "RUN_DIR_T": str(run_dir),
    }
    out = subprocess.run(
        ["bash", "-c", render_sbatch(built.job)], env=env, capture_output=True, text=True
    )
    assert out.returncode == rc, out.stdout + out.stderr
    assert ("requeue 42" in calls.read_text().splitlines()) is requeued, out.stdout
    assert ("requeueing job 42" in out.stdout) is requeued
    assert not (run_dir / "slurm" / "FINISHED").exists()


def test_a_failed_submit_leaves_no_run_dir(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir, "sbatch", 'echo "sbatch: error: invalid partition specified: gpu" >&2; exit 1')
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dtrain_cli",
            "sbatch",
            "recipe=gpt_tiny",
            "partition=gpu",
            "--submit",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1, out.stderr
    assert "sbatch failed (exit 1): sbatch: error: invalid partition specified: gpu" in out.stderr
    assert list(cwd.iterdir()) == []  # neither runs/<run> nor runs/
    # an existing run dir (a resubmit) is never removed
    old = cwd / "runs" / "kept"
    (old / "slurm").mkdir(parents=True)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dtrain_cli",
            "sbatch",
            "recipe=gpt_tiny",
            "run.name=kept",
            "--submit",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and old.is_dir()
