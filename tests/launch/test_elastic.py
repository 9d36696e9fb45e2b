"""``dtrain launch``'s refusals of a bad node range, in-process: a launch starts its fork
server before it checks, so this room. The plan's and the rest: tests/unit/test_elastic.py."""

from __future__ import annotations

import pytest

from tests.unit.test_elastic import BAD_RANGES, assert_bad_range


@pytest.mark.parametrize(("args", "message"), BAD_RANGES)
@pytest.mark.parametrize("command", ["launch"])
def test_bad_ranges_exit_2_one_line(command, args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_bad_range(command, args, message, tmp_path)
