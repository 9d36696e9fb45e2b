"""Override defects (issues 11 and 18) that need a launch: a short run warns once and trains.
The rest, in-process: tests/unit/test_overrides.py."""

from __future__ import annotations

import pytest

from tests.conftest import run_dtrain


@pytest.mark.multiproc
def test_short_run_launches_and_warns_once(tmp_path):
    run = run_dtrain(["launch", "recipe=gpt_tiny", "train.steps=5"], tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout + run.stderr
    assert out.count("warmup_steps=10 is longer than training") == 1, out
    assert [m["step"] for m in run.metrics()][-1] == 5
