"""The sbatch script as text: golden files, the CLI's dry run, config errors, values that
cannot be quoted. No SLURM needed. The script run under bash with stand-ins for srun and
scontrol (quoting against shell injection, requeue), and the torch-free dry run in a fresh
interpreter: tests/launch/test_slurm_script.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.cli.sbatch_cmd import build_job
from dtrain_cli.launch.slurm import render_sbatch

runner = CliRunner()
GOLDEN = Path(__file__).parents[1] / "golden"
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


def test_processes_per_node_given_are_kept_and_idle_gpus_refused(tmp_path):
    """``nproc_per_node=4`` on 8-GPU nodes was overridden to 8 processes without a word;
    it is kept, and a recipe that would leave GPUs idle is refused (as dtrain k8s does),
    while a script's process may drive several GPUs."""
    node = ["recipe=gpt_small", "nodes=2", "train.global_batch_size=64"]
    built = build_job([*node, "gpus_per_node=4", "nproc_per_node=4"], [], **FIXED)
    assert built.problems == [] and built.plan is not None
    assert (built.plan.nproc_per_node, built.plan.world_size) == (4, 8)
    for extra in (["nproc_per_node=4"], ["dp=4"]):
        built = build_job([*node, "gpus_per_node=8", *extra], [], **FIXED)
        assert built.problems == [
            f"cluster.gpus_per_node=8 but the plan runs {built.plan.nproc_per_node} process(es) "
            "per node (dp*tp*pp / nnodes); dtrain's trainer runs one process per GPU: set "
            f"cluster.gpus_per_node={built.plan.nproc_per_node} or leave dp and nproc_per_node "
            "unset"
        ]
    (tmp_path / "train.py").write_text("print('hi')\n")
    built = build_job(
        ["nodes=2", "gpus_per_node=8", "nproc_per_node=4"],
        [],
        **{**FIXED, "workdir": tmp_path},
        script=[str(tmp_path / "train.py")],
    )
    assert built.problems == [] and built.plan is not None
    assert (built.plan.nproc_per_node, built.plan.world_size) == (4, 8)


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


def test_a_script_s_data_keys_are_its_own(tmp_path, monkeypatch):
    """dtrain plan checks no data key of a script; sbatch refused data.path=... for one (a
    review's find)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    args = ["sbatch", "data.path=/data/x.txt", "--dry-run", "--", "train.py"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["time=4h"], "cluster.time='4h': not a SLURM time"),
        # the signal at the job's start: checkpoint and requeue at once, again and again
        (
            ["time=00:01:00"],
            "cluster.time=00:01:00 (60 s) is not longer than cluster.signal_lead_s=120",
        ),
        (["time=2", "cluster.signal_lead_s=120"], "cluster.time=2 (120 s) is not longer"),
        (["cluster.signal=KILL"], "cluster.signal='KILL': not allowed"),
        (["gpus_per_node=-1"], "cluster.gpus_per_node=-1: must be >= 0"),
        (["mem=lots"], "cluster.mem='lots': use a SLURM size"),
        (["cluster.sbatch_args=[constraint]"], "'constraint' is not an option"),
        (["cluster.rdzv_port=70000"], "cluster.rdzv_port=70000: must be <= 65535"),
        (["--dry-run", "--submit"], "choose one"),
        # the job trained on the built-in corpus (dtrain plan refused it)
        (["data.path=local.txt"], "data.path=local.txt: only read by data=text, data=tokens"),
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


def test_a_taken_run_name_of_a_slurm_job_says_to_resubmit_its_job(tmp_path):
    """Inside SLURM 'continue that one: dtrain resume RUN' trained on the login node (a new
    user's find); a dtrain sbatch run continues by its own job script."""
    from dtrain_cli.launch.rundir import taken
    from dtrain_cli.rundir.layout import RunDir

    run = RunDir(tmp_path / "runs" / "err1")
    run.plan.parent.mkdir(parents=True)
    assert taken(run).endswith(f"continue that one: dtrain resume {run.path}")
    run.slurm.mkdir()
    (run.slurm / "job.sbatch").write_text("#!/bin/bash\n")
    assert taken(run).endswith(f"continue that one: sbatch {run.slurm / 'job.sbatch'}")


def test_slurm_times_in_seconds_and_no_limit():
    from dtrain_cli.launch.slurm import time_seconds

    cases = {"30": 1800, "01:30": 90, "04:00:00": 14400, "1-00": 86400, "1-02:03": 93780,
             "1-02:03:04": 93784, "UNLIMITED": None, "0": None, "00:00:00": None}  # fmt: skip
    assert {t: time_seconds(t) for t in cases} == cases
    built = build_job(["recipe=gpt_tiny", "time=0"], [], **FIXED)  # no limit: not refused
    assert built.problems == []


def test_an_agent_on_a_finished_run_leaves_it_as_it_is(tmp_path):
    """A pod started again on a run that finished (a JobSet applied again, the same claim)
    resumed at the last step and wrote a summary of nulls over the run's: the agent, like
    the SLURM job script, says the run finished and starts nothing (exit 0)."""
    run_dir = tmp_path / "runs" / "done"
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "slurm" / "FINISHED").write_text("Sat Dec  5\n")
    summary = run_dir / "summary.json"
    summary.write_text('{"final_loss": 5.26}')
    result = runner.invoke(app, ["agent", str(run_dir), "--nnodes", "1"])
    assert result.exit_code == 0, result.output
    assert "already finished (slurm/FINISHED); not running it again" in result.output
    assert summary.read_text() == '{"final_loss": 5.26}'
