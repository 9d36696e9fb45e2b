"""The launcher's half of the hang bound: a rank that cannot write its hang record.

    DTRAIN_FAULTS="stop:step=3:rank=1" dtrain launch recipe=gpt_tiny dp=2 \\
        debug.collective_timeout_s=10      # rank 1 stopped (SIGSTOP): the run still ends

When a step runs longer than ``debug.collective_timeout_s``, every rank's watchdog writes
``logs/hang/rank_<k>.json`` and exits (:mod:`dtrain_cli.runtime.diagnostics.watchdog`).
A rank that is stopped (SIGSTOP, a debugger) or frozen outside Python writes nothing, and
it does not act on the agent's SIGTERM either: the agent would wait its 30 s grace before
killing it. So :data:`FROZEN_AFTER_S` after the first record, this launcher SIGKILLs its
own workers that wrote none (found by the pid line their log starts with, on this host),
and the run ends about ``collective_timeout_s`` + 15 s after the stuck step began.
Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from dtrain_cli.launch.hang_report import read_records
from dtrain_cli.launch.signals import launch_descendants
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import rank_process

FROZEN_AFTER_S = 10.0
"""The watchdogs' grace for each other's records (5 s) and a margin for a loaded machine."""


def frozen_ranks(run_dir: Path, world_size: int) -> list[tuple[int, int]]:
    """(rank, pid) of this launcher's workers on this host that wrote no hang record."""
    records = read_records(run_dir)
    ours = {pid for pid, _ in launch_descendants()}
    host = socket.gethostname()
    out = []
    for rank in range(world_size):
        proc = rank_process(RunDir(run_dir), rank)
        if rank not in records and proc and proc[1] == host and proc[0] in ours:
            out.append((rank, proc[0]))
    return out


@contextlib.contextmanager
def reap_frozen_ranks(
    run_dir: Path, world_size: int, after_s: float = FROZEN_AFTER_S
) -> Iterator[None]:
    """While the agent runs: once a watchdog fired, kill the ranks that never answered it."""
    stop = threading.Event()
    started = time.time()

    def watch() -> None:
        while not stop.wait(0.5):
            times = [float(r.get("time", 0)) for r in read_records(run_dir).values()]
            times = [t for t in times if t >= started]  # this launch's records only
            if not times or time.time() - min(times) < after_s:
                continue
            for _rank, pid in frozen_ranks(run_dir, world_size):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return

    thread = threading.Thread(target=watch, name="dtrain-hang-guard", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
