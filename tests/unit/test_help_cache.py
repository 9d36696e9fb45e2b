"""Which commands are help requests and what a kept help page is keyed by
(dtrain_cli/cli/help_cache.py), and the page printed again in-process. The commands in new
interpreters (nothing of Typer imported the second time): tests/launch/test_help_cache.py."""

from __future__ import annotations

import sys

import pytest

from dtrain_cli.cli import help_cache
from dtrain_cli.cli.app import app


def run_app(monkeypatch, capsys, argv: list[str]) -> tuple[str, object]:
    """What ``dtrain_cli.cli.entry.main`` does, in-process (its exit would end the test's
    process once torch is imported): print a kept page, or render it with the Typer app."""
    key = help_cache.key_for(argv)
    if help_cache.serve(key):
        return capsys.readouterr().out, 0
    with pytest.raises(SystemExit) as exit_, help_cache.recording(key):
        app(args=argv, prog_name="dtrain")
    return capsys.readouterr().out, exit_.value.code


def test_the_page_kept_is_the_page_rendered(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DTRAIN_CACHE", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "100")
    first, code = run_app(monkeypatch, capsys, ["plan", "--help"])
    assert code == 0 and "Usage: dtrain plan [OPTIONS] [overrides]" in first
    (page,) = (tmp_path / help_cache.FOLDER).glob("*.txt")
    assert page.read_text() == first
    page.write_text("a page kept before\n")  # what is printed now comes from the file
    assert run_app(monkeypatch, capsys, ["plan", "--help"]) == ("a page kept before\n", 0)


def test_an_edit_of_dtrains_code_or_typers_renders_the_page_again(tmp_path, monkeypatch):
    source = tmp_path / "module.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(help_cache, "code_files", lambda: [source])
    before = help_cache.key_for(["--help"])
    source.write_text("x = 22\n")
    assert help_cache.key_for(["--help"]) != before
    installed = tmp_path / "typer_init.py"
    installed.write_text("")
    monkeypatch.setattr(help_cache, "package_files", lambda names: [installed])
    before = help_cache.key_for(["--help"])
    installed.write_text("# reinstalled\n")
    assert help_cache.key_for(["--help"]) != before


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "recipe=gpt_small", "--help"],  # overrides: the command itself runs
        ["--version"],
        ["plan", "--help", "dp=2"],
        ["Plan", "--help"],
        [],
    ],
)
def test_only_command_words_then_a_help_flag_are_a_help_request(argv):
    assert help_cache.key_for(argv) is None


def test_a_page_cut_short_by_an_error_is_not_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DTRAIN_CACHE", str(tmp_path))
    key = help_cache.key_for(["--help"])
    with pytest.raises(RuntimeError), help_cache.recording(key):
        print("Usage: dtrain [OPTIONS] COMMAND [ARGS]...")
        raise RuntimeError("the renderer failed half-way")
    assert "Usage: dtrain" in capsys.readouterr().out
    assert not (tmp_path / help_cache.FOLDER).exists()
    assert help_cache.serve(key) is False


def test_each_way_of_starting_dtrain_keeps_its_own_page(monkeypatch):
    """The page names the program as started (``dtrain``, ``python -m dtrain_cli``)."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/dtrain", "--help"])
    script = help_cache.key_for(["--help"])
    monkeypatch.setattr(sys, "argv", ["/repo/dtrain_cli/__main__.py", "--help"])
    assert help_cache.key_for(["--help"]) != script
