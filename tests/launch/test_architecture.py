"""A launched run dir holds only the files docs/run-directory.md lists (the rules on the code:
tests/unit/test_architecture.py)."""

from __future__ import annotations

import pytest

from tests.unit.test_architecture import entry_of


@pytest.mark.multiproc
def test_a_real_run_dir_holds_only_documented_files(run_dp2):
    files = [p.relative_to(run_dp2.run_dir) for p in run_dp2.run_dir.rglob("*") if p.is_file()]
    assert files
    stray = [f.as_posix() for f in files if entry_of(f.as_posix()) is None]
    assert stray == []
