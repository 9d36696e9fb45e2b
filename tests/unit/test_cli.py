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


def test_every_command_is_summarized_on_one_line_in_help_lists():
    """Typer's rich mode keeps a docstring's own line breaks in the command list, which cut
    `export`'s summary after "(+ a JSON model"; each summary is its first paragraph, joined."""
    from dtrain_cli.cli.app import app as root

    def commands(typer_app):
        yield from typer_app.registered_commands
        for group in typer_app.registered_groups:
            yield from commands(group.typer_instance)

    found = list(commands(root))
    assert len(found) > 15
    for info in found:
        assert info.short_help and "\n" not in info.short_help, info.callback
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "one safetensors file (+ a JSON model config), or a Hugging Face folder" in result.output


def test_piped_tables_keep_every_cell_whole():
    """Piped (CliRunner's stdout is no terminal, like ``| grep`` or ``> file``), a table is
    as wide as its longest cell: rich's 80-column default ended every recipe's path in '…'
    and wrapped gpt_1b's description over four lines."""
    from dtrain_cli.config.search import list_recipes, recipe_description

    result = runner.invoke(app, ["recipes"])
    assert result.exit_code == 0
    assert "…" not in result.output
    for path in list_recipes().values():
        assert str(path) in result.output
        assert recipe_description(path) in result.output


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


def test_ctrl_c_while_the_run_dir_is_written_leaves_nothing(tmp_path, monkeypatch):
    """A Ctrl-C that lands while the launcher writes the new run dir (plan.yaml there, the
    workers not started: what tests/launch/test_launch.py's Ctrl-C hit once on a loaded CI
    machine) exits 130 and removes what this start created, ``runs/`` included."""
    from dtrain_cli.launch import rundir, signals, worker_server
    from dtrain_cli.rundir import env
    from tests.conftest import cache_dir

    for name in ("start", "stop"):  # no fork server: nothing starts a process here
        monkeypatch.setattr(worker_server, name, lambda *_a, **_k: None)
    monkeypatch.setattr(signals, "watch_interrupt", lambda: None)
    monkeypatch.setenv(env.LAUNCH_T0, "0")  # restored after the test
    monkeypatch.setenv("DTRAIN_CACHE", str(cache_dir()))
    written = rundir.materialize

    def interrupted(*args: object, **kwargs: object) -> None:
        assert (written(*args, **kwargs) / "plan.yaml").is_file()
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir, "materialize", interrupted)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["launch", "recipe=gpt_tiny", "train.steps=1"])
    assert result.exit_code == 130, result.output
    assert "stopped by SIGINT" in result.output
    assert list(tmp_path.iterdir()) == []
