"""The CLI in-process (CliRunner). As users run it (subprocess): tests/launch/test_cli.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli import __version__
from dtrain_cli.cli.app import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_recipes_table():
    result = runner.invoke(app, ["recipes"])
    assert result.exit_code == 0
    assert "gpt_tiny" in result.output and "gpt_small" in result.output
    assert "stdlib" in result.output  # the one-line description


def test_plan_prints_the_resolved_plan():
    result = runner.invoke(app, ["plan", "recipe=gpt_small", "dp=2", "optim.base_lr=3e-4"])
    assert result.exit_code == 0, result.output
    for text in ("gpt_small", "2 = 1 node(s) x 2 processes", "dp=2", "0.0003", "micro batch"):
        assert text in result.output


def test_plan_yaml_format():
    result = runner.invoke(app, ["plan", "recipe=gpt_tiny", "dp=2", "--format", "yaml"])
    assert result.exit_code == 0
    assert "world_size: 2" in result.output and "ranks:" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "recipe=nope"],
        ["plan", "recipe=gpt_tiny", "optim.bogus=1"],
        ["plan", "recipe=gpt_tiny", "train.steps=0"],
        # launch's (it starts the fork server first): tests/launch/test_cli.py
    ],
)
def test_bad_input_exit_2_one_line_no_traceback_nothing_written(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.count("error:") >= 1
    assert not (tmp_path / "runs").exists()
