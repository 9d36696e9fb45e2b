"""The sbatch script as text: golden files, quoting against shell injection, the CLI's
dry run (torch-free), config errors. No SLURM needed: the script runs under bash with
stand-ins for srun and scontrol."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.cli.sbatch_cmd import build_job
from dtrain_cli.launch.slurm import render_sbatch

runner = CliRunner()
GOLDEN = Path(__file__).parent / "golden"
FIXED = dict(
    run_dir=Path("/shared/runs/exp1"), python="/opt/venv/bin/python", workdir=Path("/home/u/proj")
)
PINNED = ["train.steps=100", "train.global_batch_size=16", "train.micro_batch_size=8"]
VARIANTS = {
    "single_cpu": ["recipe=gpt_tiny", "dp=2", *PINNED],
    "multi_cpu": [
        "recipe=gpt_tiny",
        "nodes=2",
        "dp=4",
        "partition=cpu",
        "cpus_per_task=8",
        "mem=32G",
        "time=30",
        "train.steps=100",
        "train.global_batch_size=32",
        "train.micro_batch_size=8",
        "cluster.setup=[module load gcc,source /opt/venv/bin/activate]",
        "+cluster.env.OMP_PROC_BIND=close",
    ],
    "elastic_cpu": ["recipe=gpt_tiny", "nodes=1:2", "dp=2", *PINNED],
    "single_gpu": [
        "recipe=gpt_tiny",
        "gpus_per_node=4",
        "partition=gpu",
        "account=proj",
        "qos=high",
        "train.steps=100",
        "train.global_batch_size=32",
        "train.micro_batch_size=8",
    ],
    "multi_gpu": [
        "recipe=gpt_small",
        "cluster=example_gpu",
        "nodes=2",
        "time=04:00:00",
        "train.steps=100",
        "train.global_batch_size=128",
        "train.micro_batch_size=8",
        "cluster.rdzv_port=29500",
    ],
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_golden_scripts(name):
    built = build_job(VARIANTS[name], [], **FIXED)
    assert built.problems == []
    text = render_sbatch(built.job)
    path = GOLDEN / f"sbatch_{name}.sh"
    if os.environ.get("DTRAIN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (DTRAIN_UPDATE_GOLDEN=1 rewrites it)"
    assert render_sbatch(built.job) == text  # pure: same input, same bytes


def test_gpu_variant_runs_one_worker_per_gpu():
    built = build_job(VARIANTS["multi_gpu"], [], **FIXED)
    plan = built.plan
    assert plan is not None
    assert (plan.nnodes, plan.nproc_per_node, plan.world_size) == (2, 8, 16)
    assert plan.device == "cuda" and plan.backend == "nccl"
    text = render_sbatch(built.job)
    for line in ("#SBATCH --gpus-per-node=8", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1"):
        assert line in text
    assert "#SBATCH --signal=B:USR1@300" in text and "#SBATCH --requeue" in text


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


def test_values_that_cannot_be_quoted_are_refused():
    built = build_job(
        ["recipe=gpt_tiny"], [], run_dir=Path("/r/a\nb"), python="/p", workdir=Path("/w")
    )
    assert any("newlines and control characters are not allowed" in p for p in built.problems)
    # a real newline inside a Hydra-quoted value: it would start a new #SBATCH line
    built = build_job(["recipe=gpt_tiny", "cluster.partition='gpu\n#SBATCH --uid=0'"], [], **FIXED)
    assert built.problems == [
        "cluster.partition='gpu\\n#SBATCH --uid=0': newlines and control characters are not allowed"
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["time=4h"], "cluster.time='4h': not a SLURM time"),
        (["cluster.signal=KILL"], "cluster.signal='KILL': not allowed"),
        (["gpus_per_node=-1"], "cluster.gpus_per_node=-1: must be >= 0"),
        (["mem=lots"], "cluster.mem='lots': use a SLURM size"),
        (["cluster.sbatch_args=[constraint]"], "'constraint' is not an option"),
        (["cluster.rdzv_port=70000"], "cluster.rdzv_port=70000: must be <= 65535"),
        (["--dry-run", "--submit"], "choose one"),
    ],
)
def test_bad_cluster_values_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["sbatch", "recipe=gpt_tiny", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_dry_run_prints_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["sbatch", "recipe=gpt_tiny", "nodes=2", "dp=2", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in result.output
    assert "agent" in result.output and not (tmp_path / "runs").exists()


def test_validate_job_script():
    built = build_job(["nodes=2"], [], validate=True, **FIXED)
    text = render_sbatch(built.job)
    assert "validate-cluster --nnodes 2 --nproc-per-node 1 --run-dir /shared/runs/exp1" in text
    assert "#SBATCH --no-requeue" in text and "--signal" not in text


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
