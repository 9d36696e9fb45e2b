"""`dtrain --help` is printed again from the page Typer rendered the last time, without
importing Typer, rich or a command (dtrain_cli/cli/help_cache.py), and rendered again
whenever anything the page depends on changed. The commands run as a user runs them: a new
interpreter each, its own cache folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_cli.cli import help_cache

# In a new interpreter: the command's entry point, then which heavy modules it imported.
PROBE = """
import sys
from dtrain_cli.cli.entry import main
sys.argv = ["dtrain", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = [m for m in ("typer", "click", "rich", "omegaconf", "torch") if m in sys.modules]
print(f"\\n@@exit={code} imported={','.join(heavy) or '-'}", file=sys.stderr)
"""


def dtrain(cache: Path, *argv: str, **env: str) -> tuple[str, str, str]:
    """(stdout, exit code, heavy modules imported) of ``dtrain ARGV``, output to a file."""
    full_env = {**os.environ, "DTRAIN_CACHE": str(cache), "COLUMNS": "100", **env}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=full_env
    )
    tail = proc.stderr.rsplit("@@", 1)[-1].split()
    return proc.stdout, tail[0].removeprefix("exit="), tail[1].removeprefix("imported=")


def pages(cache: Path) -> list[Path]:
    where = cache / help_cache.FOLDER
    return sorted(where.glob("*.txt")) if where.is_dir() else []


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["k8s", "submit", "-h"]])
def test_a_help_page_is_printed_again_without_importing_typer(tmp_path, argv):
    first, code, imported = dtrain(tmp_path, *argv)
    assert code == "0" and "typer" in imported and "Usage: dtrain" in first
    assert len(pages(tmp_path)) == 1
    again, code, imported = dtrain(tmp_path, *argv)
    assert (again, code, imported) == (first, "0", "-")


def test_the_page_is_rendered_again_for_another_width_or_colour_setting(tmp_path):
    wide, _, _ = dtrain(tmp_path, "--help")
    narrow, _, imported = dtrain(tmp_path, "--help", COLUMNS="60")
    assert "typer" in imported and narrow != wide
    assert max(map(len, narrow.splitlines())) <= 60 < max(map(len, wide.splitlines()))
    dtrain(tmp_path, "--help", NO_COLOR="1")
    assert len(pages(tmp_path)) == 3
    assert dtrain(tmp_path, "--help")[0] == wide


def test_a_failed_or_unkept_page_is_not_kept(tmp_path):
    _, code, _ = dtrain(tmp_path, "nosuch", "--help")
    assert code == "2" and pages(tmp_path) == []
    nowhere = "/dev/null"  # what DTRAIN_CACHE=/dev/null means everywhere: keep nothing
    first, code, imported = dtrain(Path(nowhere), "--help")
    again, code2, imported2 = dtrain(Path(nowhere), "--help")
    assert (code, code2) == ("0", "0") and first == again
    assert "typer" in imported and "typer" in imported2


def test_an_unreadable_page_is_rendered_again(tmp_path):
    first, _, _ = dtrain(tmp_path, "--help")
    (page,) = pages(tmp_path)
    page.write_bytes(b"\xff\xfe not utf-8")
    again, code, imported = dtrain(tmp_path, "--help")
    assert (again, code) == (first, "0") and "typer" in imported
    assert page.read_text() == first
