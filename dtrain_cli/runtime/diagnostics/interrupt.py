"""Ctrl-C ends a rank within seconds, even while its main thread waits inside C code.

    dtrain run dp=2 -- train.py        # Ctrl-C: every rank gone within a few seconds

Python runs a signal handler only between two bytecodes of the main thread: a rank blocked
in a C call (a c10d store wait in ``init_process_group`` for a peer that already left, a
collective) would run its ``KeyboardInterrupt`` only when that call returns, so the agent
waited its 30 s grace before killing it. Here the C-level signal trampoline's wakeup fd
wakes a thread (:mod:`dtrain_cli.signal_wakeup`): if the rank's own SIGINT handler has not run
``grace_s`` later, the main thread is stuck, and the rank exits with 130 at once. A handler
that did run (a script saving its state on ``KeyboardInterrupt``) is left alone, unless
``finish_s`` bounds it too (dtrain's own workers: they only close their logs).
Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType

from dtrain_cli.rundir.protocol import EXIT_INTERRUPTED, STEP_SIGNALS
from dtrain_cli.signal_wakeup import watch_signals


def restore_default_signals() -> None:
    """A worker's first act: the default dispositions of the signals a scheduler sends and
    of SIGINT, whatever it inherited (the fork server's handlers that ignore them, the
    agent's with ``start_method=fork``); its own handlers come after."""
    for sig in STEP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


class InterruptGuard:
    """Install once per rank, in the main thread, after the rank's SIGINT handler:
    :meth:`handler` wraps that handler so the guard knows it ran."""

    def __init__(self, *, grace_s: float = 2.0, finish_s: float | None = None) -> None:
        self.grace_s = grace_s
        self.finish_s = finish_s
        self.handled_at = float("-inf")  # when the rank's handler last ran (monotonic)
        self._handler: Callable[[int, FrameType | None], object] | None = None

    def install(self, on_interrupt: Callable[[int, FrameType | None], object]) -> None:
        def handler(signum: int, frame: FrameType | None) -> object:
            self.handled_at = time.monotonic()
            return on_interrupt(signum, frame)

        self._handler = handler
        signal.signal(signal.SIGINT, handler)
        watch_signals(self._on_signals)  # not the main thread: nothing to guard

    def _on_signals(self, numbers: frozenset[int]) -> bool:
        if signal.SIGINT in numbers and self._owns_sigint():
            self._bound_the_exit(time.monotonic())
        return False  # for the whole run

    def _owns_sigint(self) -> bool:
        """False once the code running here installed its own SIGINT handler."""
        return signal.getsignal(signal.SIGINT) is self._handler

    def _bound_the_exit(self, arrived: float) -> None:
        # the handler may have run just before this thread got the GIL back: 1 s of slack
        while time.monotonic() < arrived + self.grace_s:
            if self.handled_at >= arrived - 1.0:
                break
            time.sleep(0.05)
        else:
            self._exit("the main thread is inside a C call (a store wait, a collective)")
        if self.finish_s is None:
            return
        time.sleep(max(0.0, arrived + self.grace_s + self.finish_s - time.monotonic()))
        self._exit(f"it did not finish within {self.finish_s:g} s")

    @staticmethod
    def _exit(why: str) -> None:
        rank = os.environ.get("RANK", "?")
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.write(2, f"rank {rank}: stopped by SIGINT ({why})\n".encode())
        os._exit(EXIT_INTERRUPTED)
