"""Override and CLI-input defects (issues 11 and 18): what a user types by mistake gets one
line naming the key and the form to write, exit code 2; what is fine runs."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from tests.conftest import run_dtrain

runner = CliRunner()


NO_SERVER = "launcher.start_method=spawn"  # in-process launches: no fork server to outlive us


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


@pytest.mark.parametrize(
    "name", ["../../../tmp/escape", "a/b", "..", ".", "-rf", "", "x\\y", "tab\there"]
)
@pytest.mark.parametrize("command", ["plan", "sbatch", "launch"])
def test_run_name_must_be_one_folder_name(name, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [command, "recipe=gpt_tiny", f"run.name={name!r}"]
    extra = {"sbatch": ["--dry-run"], "launch": [NO_SERVER]}.get(command, [])
    result = runner.invoke(app, args + extra)
    assert result.exit_code == 2, result.output
    assert "RUN_DIR=" not in result.output and "Traceback" not in result.output
    (line,) = errors(result)
    assert line.startswith("error: run.name=") and "single folder name" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "tmp").exists()


def test_rdzv_id_names_the_run_dir_and_is_checked_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "recipe=gpt_tiny", NO_SERVER, "dp=2", "--nnodes", "2", "--node-rank", "0"]
    args += ["--rdzv-endpoint", "localhost:29511", "--rdzv-id", "../escape"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--rdzv-id='../escape': contains a path separator" in result.output
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs").exists()


def test_ordinary_run_names_are_fine():
    for name in ("exp1", "gpt_tiny-20261201-080000", "ref $(touch X) it's"):
        assert plan("recipe=gpt_tiny", f"run.name={name!r}").exit_code == 0, name
