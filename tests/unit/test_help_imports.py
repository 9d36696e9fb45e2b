"""`dtrain --help` renders with Typer's rich help without importing rich.markdown or
rich.traceback (dtrain_cli/cli/help_imports.py), and the stand-ins behave as the real
classes when used after all. In-process: each test unloads Typer's renderer and the
deferred modules (monkeypatch puts them back) and imports them as a fresh process would."""

from __future__ import annotations

import sys

import pytest
import typer
from typer.testing import CliRunner

from dtrain_cli.cli import help_imports
from dtrain_cli.cli.app import app

HEAVY = ("rich.markdown", "rich.emoji", "rich.traceback", "rich.syntax", "pygments", "markdown_it")


@pytest.fixture
def fresh_renderer(monkeypatch):
    """As in a new process: no typer.rich_utils, none of HEAVY, the finder installed."""
    monkeypatch.delattr(typer, "rich_utils", raising=False)
    for name in list(sys.modules):
        if name == help_imports.TARGET or any(name == h or name.startswith(h + ".") for h in HEAVY):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    help_imports.install()


def _heavy_loaded() -> list[str]:
    return [h for h in HEAVY if h in sys.modules]


def test_help_is_rendered_by_typers_rich_renderer_without_markdown_or_tracebacks(
    fresh_renderer,
):
    result = CliRunner().invoke(app, ["--help"], terminal_width=100)
    assert result.exit_code == 0
    assert "Usage: dtrain" in result.output and "─ Commands ─" in result.output  # rich panels
    assert help_imports.TARGET in sys.modules
    assert _heavy_loaded() == []


def test_a_usage_error_is_rendered_the_same_way(fresh_renderer):
    result = CliRunner().invoke(app, ["--no-such-option"], terminal_width=100)
    assert result.exit_code == 2 and "No such option" in result.output
    assert help_imports.TARGET in sys.modules and _heavy_loaded() == []


def test_the_stand_ins_become_the_real_classes_when_used(fresh_renderer):
    import typer.rich_utils as ru

    assert _heavy_loaded() == []  # deferred, and the stand-ins already out of sys.modules
    md = ru._make_rich_text(text="**bold**", markup_mode="markdown")
    from rich.markdown import Markdown  # now the real module

    assert type(md) is Markdown
    assert ru.Emoji.replace(":thumbs_up:") == "\N{THUMBS UP SIGN}"
    try:
        raise ValueError("x")
    except ValueError as exc:
        tb = ru.Traceback.from_exception(type(exc), exc, exc.__traceback__)
    from rich.traceback import Traceback

    assert type(tb) is Traceback
