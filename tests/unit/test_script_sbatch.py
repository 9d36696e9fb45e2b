"""``dtrain sbatch -- train.py ARGS``: the batch script of your own script (golden file),
and what its run dir holds for ``dtrain agent`` on every node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dtrain_cli.cli.sbatch_cmd import build_job
from dtrain_cli.errors import ConfigError
from dtrain_cli.launch.slurm import render_sbatch

GOLDEN = Path(__file__).parents[1] / "golden"
SCRIPTS = Path(__file__).parents[1] / "scripts"
FIXED = dict(run_dir=Path("/shared/runs/exp1"), python="/opt/venv/bin/python")
PROJECT = "/home/u/proj"  # the golden file's working directory


def script_job(overrides: list[str], script: list[str]):
    built = build_job(overrides, [], workdir=SCRIPTS, script=script, **FIXED)
    assert built.problems == []
    return built, render_sbatch(built.job).replace(str(SCRIPTS.resolve()), PROJECT)


def test_golden_script_job():
    built, text = script_job(
        ["nodes=2", "dp=8", "partition=cpu", "time=30", "launcher.max_restarts=1"],
        ["ddp_plain.py", "--epochs", "3", "--name=it's $(x)"],
    )
    path = GOLDEN / "sbatch_script_multi_cpu.sh"
    if os.environ.get("DTRAIN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (DTRAIN_UPDATE_GOLDEN=1 rewrites it)"
    # every node runs the same agent on the run dir; the script comes from its plan
    assert '"$PYTHON" -m dtrain_cli agent /shared/runs/exp1 --nnodes 2' in text
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=B:USR1@120" in text
    plan = built.plan
    assert plan is not None and plan.script is not None
    assert plan.script.argv() == ["ddp_plain.py", "--epochs", "3", "--name=it's $(x)"]
    assert plan.script.workdir == str(SCRIPTS.resolve())
    assert (plan.nnodes, plan.nproc_per_node, plan.world_size) == (2, 4, 8)
    assert built.cfg.script.args == ["--epochs", "3", "--name=it's $(x)"]


def test_module_job_and_missing_script():
    built, text = script_job(["nodes=2", "dp=2"], ["-m", "probepkg.probe", "dump", "out"])
    assert "# dtrain sbatch: run exp1 (script -m probepkg.probe dump out)" in text
    assert built.plan.script.file == str((SCRIPTS / "probepkg" / "probe.py").resolve())
    with pytest.raises(ConfigError, match=r"script nothere\.py: not found"):
        build_job(["dp=2"], [], workdir=SCRIPTS, script=["nothere.py"], **FIXED)


def test_cpu_nodes_take_processes_per_node_as_torchrun_does():
    """``dtrain sbatch nodes=2 nproc_per_node=4 -- train.py`` on CPU nodes: 4 ranks a node,
    8 in all, as ``torchrun --nnodes 2 --nproc-per-node 4``; before, 'set dp=8'."""
    built, _ = script_job(["nodes=2", "nproc_per_node=4"], ["ddp_plain.py"])
    assert (built.plan.nnodes, built.plan.nproc_per_node, built.plan.world_size) == (2, 4, 8)
