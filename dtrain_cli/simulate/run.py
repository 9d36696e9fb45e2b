"""Start the simulated ranks: one process per rank (what ``python -m
dtrain_cli.runtime.simulate`` runs), as many at once as there are cores. Torch-free: the
ranks are forked from multiprocessing's fork server, which imports torch and the
simulator once for every rank of every layout this command simulates (a sweep, ``advise
--simulate``), not this process; each rank is a fresh process of its own (its own fake
process group), its output in ``simulate/rank_<r>.log``.

    dtrain simulate recipe=gpt_1b dp=64 tp=8 pp=2 --ranks 0,1023
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env

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
    model_modules: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Each rank's result (``ok``, measurements or ``error``), in the order asked;
    ``jobs`` ranks at once (0: as many as there are cores). ``model_modules``: what the
    model's build imports, for the fork server to import once (the server starts once per
    process: the first call's modules; a sweep's layouts share their model)."""
    out_dir = run_dir / "simulate"
    out_dir.mkdir(parents=True, exist_ok=True)
    context = _fork_server(model_modules)
    slots = jobs if jobs > 0 else max(1, os.cpu_count() or 1)
    waiting, running, done = list(ranks), {}, {}
    try:
        while waiting or running:
            while waiting and len(running) < slots:
                r = waiting.pop(0)
                argv = [str(run_dir), "--rank", str(r), "--steps", str(steps)]
                argv += ["--compute", compute, "--out", str(out_dir / f"rank_{r}.json")]
                proc = context.Process(
                    target=_rank_main, args=(argv, str(out_dir / f"rank_{r}.log")), daemon=False
                )
                proc.start()
                running[r] = (proc, time.monotonic())
            for r, (proc, t0) in list(running.items()):
                if proc.is_alive() and time.monotonic() - t0 < timeout_s:
                    continue
                if proc.is_alive():
                    proc.kill()
                proc.join()
                done[r] = _result(out_dir / f"rank_{r}.json", r, proc.exitcode)
                del running[r]
            time.sleep(0.05)
    finally:  # Ctrl-C, or any error here: no rank outlives this command
        for proc, _ in running.values():
            proc.kill()
            proc.join()
    return [done[r] for r in ranks]


RANK_MODULE = "dtrain_cli.runtime.simulate"
"""What a rank runs (``main(argv)``)."""
PRELOAD = (RANK_MODULE, "dtrain_cli.runtime.trainer")
"""Imported once by the fork server (:mod:`.server_preload`, collection paused): the
simulator and the worker's trainer it runs, then the model's modules."""


def _fork_server(model_modules: Sequence[str]) -> Any:
    """multiprocessing's fork server, preloading :data:`PRELOAD` (started on first use, one
    for this process); the ranks run one intra-op thread each."""
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dtrain_cli.simulate.server_preload"])
    # the server's environment (the ranks' too), while it starts
    modules = ",".join([*PRELOAD, *model_modules])
    server_env = {"OMP_NUM_THREADS": "1", env.SIMULATE_PRELOAD: modules}
    before = {key: os.environ.get(key) for key in server_env}
    os.environ.update(server_env)
    try:
        forkserver.ensure_running()
    finally:
        for key, value in before.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value
    return context


def _rank_main(argv: list[str], log: str) -> None:
    """A rank's process: its output to its log, then the simulator's ``main``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    try:
        code = importlib.import_module(RANK_MODULE).main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def _result(path: Path, rank: int, code: int | None) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    why = f"the process ended with code {code} before writing its result"
    return {"rank": rank, "ok": False, "error": f"{why} (see simulate/rank_{rank}.log)"}
