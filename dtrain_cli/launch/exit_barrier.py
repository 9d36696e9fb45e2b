"""The signal that ends a job also ends an agent waiting at torch's exit barrier.

    kubectl delete pod <run>-node-0-0     # an eviction, a preemption; or SLURM's scancel

When its workers have ended, torch's elastic agent waits for every other node's agent at
its exit barrier (``SimpleElasticAgent._exit_barrier``: up to 300 s in one blocking
``TCPStore.wait``). A signal's Python handler runs only when that call returns, so an agent
that gets SIGTERM there stays until the grace period's SIGKILL (Kubernetes'
``terminationGracePeriodSeconds``, SLURM's ``KillWait``), and a JobSet's restart or a
requeue waits for it. Python writes each signal's number to its wakeup fd at once, from
C (:mod:`dtrain_cli.signal_wakeup`): a thread here reads them. After a termination signal,
once no worker of this launcher is left and the launch has still not returned
:data:`SETTLE_S` later, the launcher reports its outcome and exits with its code
(:func:`dtrain_cli.launch.local.launch_local` says which: the preemption's checkpoint, or
the signal). Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from dtrain_cli.launch.signals import child_pids
from dtrain_cli.signal_wakeup import watch_signals

TERMINATING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
"""The signals torch's agent ends on (``SignalException``)."""

SETTLE_S = 3.0
"""How long after its last worker ended the launch has to return by itself."""


@contextlib.contextmanager
def end_when_signalled_at_exit_barrier(end: Callable[[int], None]) -> Iterator[None]:
    """While the agent runs: ``end(signum)`` (it reports and exits the process) when a
    termination signal came and the agent could not act on it. Nothing is installed
    outside the main thread, or when another reader owns the wakeup fd."""
    returned = threading.Event()
    lock = threading.Lock()
    owner = os.getpid()

    def on_signals(numbers: frozenset[int]) -> bool:
        if not (terminating := numbers & TERMINATING):
            return False
        _end_if_stuck(min(terminating), owner, returned, lock, end)
        return True  # once: the launch returned, or this process ended

    stop = watch_signals(on_signals, replace=False)
    try:
        yield
    finally:
        with lock:  # end() never runs after this
            returned.set()
        if stop is not None:
            stop()


def _end_if_stuck(
    signum: int, owner: int, returned: threading.Event, lock: threading.Lock, end: Callable
) -> None:
    """Wait while workers run (the agent stops them, or a restart starts new ones); once
    none has run for :data:`SETTLE_S` and the launch has not returned, ``end``."""
    quiet_since = None
    while not returned.wait(0.2):
        if child_pids(owner):
            quiet_since = None
            continue
        quiet_since = quiet_since or time.monotonic()
        if time.monotonic() - quiet_since >= SETTLE_S:
            with lock:
                if not returned.is_set():
                    end(signum)
            return
