"""The prepared GPU benchmark must keep working while no GPU is around: its CPU smoke mode
runs the same plumbing (dtrain launch, the plain loop with the run's flags, the table)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, cache_dir


@pytest.mark.multiproc
def test_gpu_bench_smoke_on_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_bench.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "DTRAIN_CACHE": str(cache_dir())},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (tmp_path / "gpu_results.md").read_text()
    assert "| gpt_tiny |" in table and "dtrain MFU" in table
    (record,) = json.loads((tmp_path / "gpu_results.json").read_text())
    assert record["dtrain"]["summary"]["tokens_per_s"] > 0
    assert record["plain"]["tokens_per_s"] > 0
    # the same job on both sides: same model, data and optimizer give the same parameters
    d_sum = record["dtrain"]["summary"]["param_sum"]
    assert record["plain"]["param_sum"] == pytest.approx(d_sum, rel=1e-5)
