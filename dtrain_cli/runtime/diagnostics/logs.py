"""Logging, set up once per process: every rank to its file, rank 0 also to the console.

Every rank logs to ``<run>/logs/rank_<k>.log``; rank 0 also to the console, through the
same rich console as its progress bar. A record with ``extra={"console": False}`` goes to
the file only. Python warnings (torch's ``lr_scheduler.step() before optimizer.step()``,
say) take the same way, each one once: they may be the first sign of a bug.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import PID_LINE

log = logging.getLogger("dtrain")
QUIET = {"console": False}
"""``extra=`` of a record for the rank's file only."""


class _ConsoleHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:  # tracebacks go to the rank's file; the launcher reports the error
            return
        if not getattr(record, "console", True):  # the rank's file only (logging.progress=off)
            return
        self.console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)


_fault_log: list[TextIO] = []


def setup_logging(run_dir: Path, rank: int, console: Console | None) -> None:
    """Every rank to ``logs/rank_<k>.log`` (its first line names the rank's process id,
    so a user can find rank k's process), and there the Python stack of a fatal signal
    (faulthandler); rank 0 also to the console."""
    run = RunDir(run_dir)
    run.logs.mkdir(parents=True, exist_ok=True)
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    file_handler = logging.FileHandler(run.rank_log(rank))
    file_handler.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(message)s"))
    log.addHandler(file_handler)
    # a fatal signal (a C extension's fault, an abort) leaves every thread's stack here, not
    # on the console as torch's error handler set it (60 lines of it; the report names it),
    # through a file of its own: the handler's is closed at exit, and its fd then reused
    _fault_log[:] = [open(run.rank_log(rank), "a")]  # noqa: SIM115 (open while we live)
    faulthandler.enable(file=_fault_log[0], all_threads=True)
    if console is not None:
        handler = _ConsoleHandler(console)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    pid_line = PID_LINE.format(rank=rank, pid=os.getpid(), host=socket.gethostname())
    log.info(pid_line, extra=QUIET)  # the launcher finds rank k's process by it
    route_warnings()


def route_warnings() -> None:
    """Python's warnings of this process to its log (and rank 0's console), each distinct
    one once (by category, message and place): not to a stderr nobody reads."""
    seen: set[tuple[Any, ...]] = set()

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        key = (category, str(message), filename, lineno)
        if key in seen:
            return
        seen.add(key)
        where = Path(filename)
        where_text = str(Path(*where.parts[-2:])) if len(where.parts) > 2 else filename
        log.warning("warning: %s: %s (%s:%d)", category.__name__, message, where_text, lineno)

    warnings.showwarning = show


def make_console(is_logging_rank: bool) -> Console | None:
    return Console(file=sys.stdout) if is_logging_rank else None
