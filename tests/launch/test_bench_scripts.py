"""The prepared GPU benchmark must keep working while no GPU is around: its CPU smoke mode
runs the same plumbing (dtrain launch, the plain loop with the run's flags, the table)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.multiproc
def test_the_bench_counts_its_own_warm_pools_cpu_and_not_another_pools(tmp_path):
    """bench/quiet.py takes the CPU of the bench's warm pools (its launches' workers run
    there, not among its children) as its own; a pool of someone else's on the machine is
    a neighbour, whose work must count as disturbance (it counted every pool's)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from quiet import CLK_TCK, pool_cpu_s
    finally:
        sys.path.remove(str(REPO / "bench"))
    # busy for 0.3 s of its own CPU (not of the clock: under the parallel suite a loaded
    # machine gave it 0.04 s in 0.3 s), then still: the counters stop moving before read
    code = "import os, time; os.setsid()\nwhile time.process_time() < 0.3: pass\n"
    code += "print(flush=True); time.sleep(30)"

    def pool(where):  # looks like a pool: its own session, the module, a slot under where
        args = [sys.executable, "-c", code, "dtrain_cli.launch.pool_server", f"{where}/slot"]
        return subprocess.Popen(args, stdout=subprocess.PIPE)

    def cpu_s(p):
        fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / CLK_TCK

    ours, theirs = pool(tmp_path / "ours"), pool(tmp_path / "theirs")
    try:
        for p in (ours, theirs):
            p.stdout.readline()
        assert cpu_s(ours) > 0.05 and cpu_s(theirs) > 0.05
        assert pool_cpu_s(tmp_path / "ours") == cpu_s(ours)
        assert pool_cpu_s(tmp_path / "theirs") == cpu_s(theirs)
        assert pool_cpu_s(tmp_path / "nobody") == 0.0
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()
