"""Start the simulated ranks: one ``python -m dtrain_cli.runtime.simulate`` per rank, as
many at once as there are cores. Torch-free (the ranks import torch, not this process).

    dtrain simulate recipe=gpt_1b dp=64 tp=8 pp=2 --ranks 0,1023
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dtrain_cli.plan.plan import Plan

FAKE_FLOPS = 2e11
"""Above this many FLOPs per rank and step, ``--compute auto`` runs the steps on fake
tensors (shapes only): a 2-core machine does about 5e10 a second."""


def choose_compute(plan: Plan, tokens_per_sample: int, asked: str) -> str:
    if asked != "auto":
        return asked
    est, b = plan.estimates, plan.batch
    flops = 6 * est.params_per_rank * b.micro_batch_size * b.grad_accum * tokens_per_sample
    return "fake" if flops > FAKE_FLOPS else "real"


def run_ranks(
    run_dir: Path,
    ranks: list[int],
    steps: int,
    compute: str,
    timeout_s: float = 900.0,
    jobs: int = 0,
) -> list[dict[str, Any]]:
    """Each rank's result (``ok``, measurements or ``error``), in the order asked;
    ``jobs`` ranks at once (0: as many as there are cores)."""
    out_dir = run_dir / "simulate"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    slots = jobs if jobs > 0 else max(1, os.cpu_count() or 1)
    waiting, running, done = list(ranks), {}, {}
    while waiting or running:
        while waiting and len(running) < slots:
            r = waiting.pop(0)
            cmd = [sys.executable, "-m", "dtrain_cli.runtime.simulate", str(run_dir)]
            cmd += ["--rank", str(r), "--steps", str(steps), "--compute", compute]
            cmd += ["--out", str(out_dir / f"rank_{r}.json")]
            log = open(out_dir / f"rank_{r}.log", "w")  # noqa: SIM115 (closed below)
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            running[r] = (proc, log, time.monotonic())
        for r, (proc, log, t0) in list(running.items()):
            if proc.poll() is None and time.monotonic() - t0 < timeout_s:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
            done[r] = _result(out_dir / f"rank_{r}.json", r, proc.returncode)
            del running[r]
        time.sleep(0.05)
    return [done[r] for r in ranks]


def _result(path: Path, rank: int, code: int) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    why = f"the process ended with code {code} before writing its result"
    return {"rank": rank, "ok": False, "error": f"{why} (see simulate/rank_{rank}.log)"}
