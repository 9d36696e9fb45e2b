"""Override and CLI-input defects (issues 11 and 18): what a user types by mistake gets one
line naming the key and the form to write, exit code 2; what is fine runs."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from tests.conftest import run_dtrain

runner = CliRunner()


def plan(*args: str):
    return runner.invoke(app, ["plan", *args])


def errors(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


def test_short_run_plans_with_a_warning():
    result = plan("recipe=gpt_tiny", "train.steps=5")
    assert result.exit_code == 0, result.output
    assert "warmup_steps=10 is longer than training (train.steps=5)" in result.output


@pytest.mark.multiproc
def test_short_run_launches_and_warns_once(tmp_path):
    run = run_dtrain(["launch", "recipe=gpt_tiny", "train.steps=5"], tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout + run.stderr
    assert out.count("warmup_steps=10 is longer than training") == 1, out
    assert [m["step"] for m in run.metrics()][-1] == 5
