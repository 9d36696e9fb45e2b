"""Hang watchdog: a step that takes longer than ``debug.collective_timeout_s`` ends the run
with every rank's stack and the last collective each rank entered.

    DTRAIN_FAULTS="hang:step=7:rank=1" dtrain launch recipe=gpt_tiny dp=2 \\
        debug.collective_timeout_s=10
    # -> "hang: rank 1 never joined all_reduce #7 (step 7, logging); rank 0 waited in it"

Per step the loop only stores the step and the time (:meth:`Watchdog.beat`); dtrain's own
collectives (the logging all-reduce, validation, checks) bump a counter on entry and exit
(:data:`COLLECTIVES`). A daemon thread looks once a second: when the step in progress is
older than the timeout it writes ``logs/hang/rank_<k>.txt`` (``faulthandler``: every
thread's Python stack) and ``rank_<k>.json`` (step, where the main thread is, the last
collective), waits a few seconds for the other ranks' files, and ends the process with
:data:`EXIT_HANG`. Every rank of a hung job is blocked, so every rank's watchdog fires;
the launcher (:mod:`dtrain_cli.launch.hang_report`) reads the files and names the stuck
and missing ranks. The process group's timeout is the same plus :data:`PG_MARGIN_S`, so
gloo's/NCCL's own error comes only if the watchdog could not act.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import EXIT_HANG

log = logging.getLogger("dtrain")

PG_MARGIN_S = 15.0
"""The process group's timeout is the watchdog's plus this."""
GRACE_S = 5.0
"""After writing its files, a rank waits at most this long for the others' files."""


class CollectiveLog:
    """dtrain's own collectives on this rank: how many were entered, the latest one's op
    and step, and whether this rank is inside it now. Two attribute writes each way."""

    def __init__(self) -> None:
        self.count = 0
        self.op = ""
        self.what = ""
        self.step = 0
        self.inside = False

    @contextlib.contextmanager
    def enter(self, op: str, step: int, what: str) -> Iterator[None]:
        self.count += 1
        self.op, self.step, self.what, self.inside = op, step, what, True
        try:
            yield
        finally:
            self.inside = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "op": self.op,
            "what": self.what,
            "step": self.step,
            "inside": self.inside,
        }


COLLECTIVES = CollectiveLog()


def enable_flight_recorder(backend: str, collective_timeout_s: float) -> None:
    """Before the process group exists: NCCL keeps its recent collectives for the dump."""
    if backend == "nccl" and collective_timeout_s > 0:
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")


def process_group_timeout_s(collective_timeout_s: float, hang_watchdog: bool) -> float:
    """``debug.collective_timeout_s``, a margin later when the watchdog speaks first;
    torch's 300 s without a limit of dtrain's."""
    if collective_timeout_s <= 0:
        return 300.0
    return collective_timeout_s + (PG_MARGIN_S if hang_watchdog else 0.0)


class Watchdog:
    def __init__(
        self,
        run_dir: Path,
        rank: int,
        world_size: int,
        timeout_s: float,
        grace_s: float = GRACE_S,
        backend: str = "gloo",
    ) -> None:
        self.backend = backend
        self.dir = RunDir(run_dir).hang
        self.rank, self.world_size, self.timeout_s, self.grace_s = (
            rank,
            world_size,
            timeout_s,
            grace_s,
        )
        self.step = 0
        self.since = time.monotonic()
        self._paused = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread().ident

    def beat(self, step: int) -> None:
        """The loop is at ``step`` now (cheap: every step)."""
        self.step, self.since = step, time.monotonic()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """A checkpoint save: not counted (a slow file system is no hang; a rank frozen in
        the save's collectives meets the process group's timeout, the watchdog's + 15 s);
        the clock starts again when it is done."""
        self._paused = True
        try:
            yield
        finally:
            self.since = time.monotonic()
            self._paused = False

    def __enter__(self) -> Watchdog:
        if self.timeout_s > 0 and self._thread is None:
            self.since = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="dtrain-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        poll = min(1.0, self.timeout_s / 10)
        while not self._stop.wait(poll):
            waited = time.monotonic() - self.since
            if waited > self.timeout_s and not self._paused:
                self.fire(waited)
                return

    def where(self) -> str:
        """The main thread's innermost frame: ``file:line in function``."""
        frame = sys._current_frames().get(self._main or 0)
        if frame is None:
            return "?"
        last = traceback.extract_stack(frame)[-1]
        return f"{Path(last.filename).name}:{last.lineno} in {last.name}"

    def dump_flight_recorder(self) -> str | None:
        """NCCL: torch's Flight Recorder ring of recent collectives (enabled by
        :func:`enable_flight_recorder`) into ``rank_<k>.nccl_trace.pkl`` (read it with
        ``torchfrtrace``). Not measured here (no GPUs): best effort."""
        if self.backend != "nccl":
            return None
        try:
            from torch._C._distributed_c10d import _dump_nccl_trace

            path = self.dir / f"rank_{self.rank}.nccl_trace.pkl"
            path.write_bytes(_dump_nccl_trace())
            return path.name
        except Exception as exc:  # a missing or failing recorder must not stop the report
            return f"unavailable: {type(exc).__name__}"

    def fire(self, waited: float) -> None:
        """Write this rank's stacks and record, wait briefly for the others', exit."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"rank_{self.rank}.txt", "w") as f:
            f.write(f"rank {self.rank}: step {self.step + 1} running for {waited:.1f} s\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        record = {
            "rank": self.rank,
            "pid": os.getpid(),
            "world_size": self.world_size,
            "step": self.step + 1,
            "waited_s": round(waited, 1),
            "timeout_s": self.timeout_s,
            "where": self.where(),
            "collective": COLLECTIVES.as_dict(),
            "time": time.time(),
        }
        record["nccl_trace"] = self.dump_flight_recorder()
        tmp = self.dir / f".rank_{self.rank}.json.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(self.dir / f"rank_{self.rank}.json")
        log.error(
            "hang: step %d has run %.0f s (debug.collective_timeout_s=%g); at %s; last "
            "collective %s #%d%s; stacks in %s",
            self.step + 1,
            waited,
            self.timeout_s,
            record["where"],
            COLLECTIVES.op or "-",
            COLLECTIVES.count,
            " (inside it)" if COLLECTIVES.inside else "",
            self.dir,
        )
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            if len(list(self.dir.glob("rank_*.json"))) >= self.world_size:
                break
            time.sleep(0.1)
        for handler in log.handlers:
            handler.flush()
        os._exit(EXIT_HANG)  # the launcher says where it hung (launch/hang_report.py)
