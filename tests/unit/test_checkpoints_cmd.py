"""`dtrain checkpoints PATH` takes what `dtrain resume --ckpt` takes: a run dir, its
checkpoints/ folder or one checkpoints/step_* folder; anything else is bad input (exit 2).
A step folder ended in a FileNotFoundError traceback, and /tmp in exit 1 'no checkpoints'."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "runs" / "r"
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    (run / "plan.yaml").write_text("world_size: 1\n")
    return run


@pytest.mark.parametrize("given", ["", "checkpoints", "checkpoints/step_000003"])
def test_a_run_its_checkpoints_or_one_step_list_the_same_run(run_dir, given):
    result = CliRunner().invoke(app, ["checkpoints", str(run_dir / given)], env={"COLUMNS": "300"})
    assert f"checkpoints of {run_dir}" in result.output, result.output
    assert "step_000003" in result.output or "│ 3 " in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_folder_that_is_no_run_is_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["checkpoints", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path}: not a run dir (no plan.yaml); give a folder `dtrain launch` made"
    )
