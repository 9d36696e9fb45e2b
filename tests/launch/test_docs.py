"""The documented errors of ``launch``, ``run`` and ``resume`` lines, as a subprocess: those
commands start the workers' fork server before they check anything. Every other documented
command and error: tests/unit/test_docs.py (in-process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.test_docs import CONSOLE, STARTS_A_PROCESS, assert_printed, workdir

CONSOLE_LAUNCHES = [c for c in CONSOLE if c.argv[0] in STARTS_A_PROCESS]


@pytest.mark.parametrize("cmd", CONSOLE_LAUNCHES, ids=[c.id for c in CONSOLE_LAUNCHES])
def test_every_documented_error_is_what_dtrain_prints(tmp_path, cmd):
    proc = subprocess.run(
        [sys.executable, "-m", "dtrain_cli", *cmd.argv],
        cwd=workdir(tmp_path, cmd.cwd),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_printed(cmd, proc.returncode, proc.stdout + proc.stderr)
