"""Elastic SLURM jobs as text (no SLURM): ``parallel.nnodes=MIN:MAX`` asks for a node range
and survives a lost node's task; ``dtrain sbatch --join`` refuses what cannot join. The
script under bash and the agent's checks: tests/launch/test_slurm_elastic_script.py; the
live drill: tests/launch/test_slurm_elastic.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.cli.sbatch_cmd import build_job
from dtrain_cli.launch.rundir import materialize
from dtrain_cli.launch.slurm import render_sbatch

ELASTIC = ["recipe=gpt_tiny", "nodes=1:2", "dp=2", "train.global_batch_size=8"]


def make_elastic_run(tmp_path: Path) -> Path:
    """An elastic run dir as ``dtrain sbatch --submit`` leaves it (config, plan, slurm/)."""
    run_dir = tmp_path / "runs" / "exp1"
    built = build_job(ELASTIC, [], run_dir=run_dir, python="/p", workdir=tmp_path)
    assert built.problems == [] and built.plan is not None
    materialize(built.cfg, built.plan, run_dir)
    (run_dir / "slurm").mkdir()
    return run_dir


@pytest.fixture
def elastic_run(tmp_path: Path) -> Path:
    return make_elastic_run(tmp_path)


def sbatch_join(*args: str) -> tuple[int, str]:
    """``dtrain sbatch --join ...`` in-process (torch-free): exit code, output."""
    result = CliRunner().invoke(app, ["sbatch", "--join", *args])
    return result.exit_code, result.output


def test_an_elastic_job_asks_for_a_node_range_and_does_not_kill_on_a_lost_task(tmp_path):
    built = build_job(ELASTIC, [], run_dir=tmp_path / "r", python="/p", workdir=tmp_path)
    text = render_sbatch(built.job)
    assert "#SBATCH --nodes=1-2\n" in text and "#SBATCH --no-kill\n" in text
    # a task count would make SLURM grant MIN nodes with MAX idle; srun runs one per node
    assert (
        "#SBATCH --ntasks-per-node" not in text and "srun --export=ALL --ntasks-per-node=1" in text
    )
    assert "--no-kill --kill-on-bad-exit=0" in text and "--kill-on-bad-exit=1" not in text
    assert "agent " + str(tmp_path / "r") + " --nnodes 1:2" in text
    fixed = build_job(["recipe=gpt_tiny", "nodes=2", "dp=2"], [], run_dir=tmp_path / "r")
    fixed_text = render_sbatch(fixed.job)  # a fixed-size job still ends on a failed node
    assert "#SBATCH --nodes=2\n" in fixed_text and "--kill-on-bad-exit=1" in fixed_text
    assert "--no-kill" not in fixed_text and "rendezvous" not in fixed_text


def test_join_refuses_what_cannot_join(tmp_path, elastic_run):
    fixed = tmp_path / "runs" / "fixed"
    built = build_job(["recipe=gpt_tiny", "nodes=2", "dp=2"], [], run_dir=fixed, workdir=tmp_path)
    materialize(built.cfg, built.plan, fixed)
    cases = [
        ([str(fixed)], "the run is not elastic (parallel.nnodes=2)"),
        ([str(elastic_run), "nodes=2"], "nodes=2: a join job adds 1 to 1 node(s)"),
        ([str(elastic_run), "dp=4"], "dp=4: --join takes only nodes=K"),
        ([str(tmp_path)], "not a run dir"),
    ]
    for args, message in cases:
        code, output = sbatch_join(*args)
        assert code == 2, (args, output)
        assert message in output and len(output.strip().splitlines()) == 1, output
    assert not (elastic_run / "slurm" / "join.sbatch").exists()
