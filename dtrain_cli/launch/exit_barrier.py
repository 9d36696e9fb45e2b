"""The signal that ends a job also ends an agent waiting at torch's exit barrier.

    kubectl delete pod <run>-node-0-0     # an eviction, a preemption; or SLURM's scancel

When its workers have ended, torch's elastic agent waits for every other node's agent at
its exit barrier (``SimpleElasticAgent._exit_barrier``: up to 300 s in one blocking
``TCPStore.wait``). A signal's Python handler runs only when that call returns, so an agent
that gets SIGTERM there stays until the grace period's SIGKILL (Kubernetes'
``terminationGracePeriodSeconds``, SLURM's ``KillWait``), and a JobSet's restart or a
requeue waits for it. Python writes each signal's number to its wakeup fd at once, from
C (:func:`signal.set_wakeup_fd`): a thread here reads them. After a termination signal,
once no worker of this launcher is left and the launch has still not returned
:data:`SETTLE_S` later, the launcher reports its outcome and exits with its code
(:func:`dtrain_cli.launch.local.launch_local` says which: the preemption's checkpoint, or
the signal). Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

from dtrain_cli.launch.signals import child_pids

TERMINATING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
"""The signals torch's agent ends on (``SignalException``)."""

SETTLE_S = 3.0
"""How long after its last worker ended the launch has to return by itself."""


@contextlib.contextmanager
def end_when_signalled_at_exit_barrier(end: Callable[[int], None]) -> Iterator[None]:
    """While the agent runs: ``end(signum)`` (it reports and exits the process) when a
    termination signal came and the agent could not act on it. Nothing is installed
    outside the main thread, or when another reader owns the wakeup fd."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = socket.socketpair()
    write.setblocking(False)
    previous = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    if previous != -1:  # someone else reads the signals: theirs stays
        signal.set_wakeup_fd(previous)
        read.close()
        write.close()
        yield
        return
    returned = threading.Event()
    lock = threading.Lock()
    watch = threading.Thread(
        target=_watch, args=(read, returned, lock, end), name="dtrain-exit-barrier", daemon=True
    )
    watch.start()
    os.register_at_fork(after_in_child=_forget_in_child)  # fork start method: a worker's
    try:  # signals are its own, not this launcher's
        yield
    finally:
        with lock:  # end() never runs after this
            returned.set()
        signal.set_wakeup_fd(-1)
        write.close()  # the thread's recv sees the end
        watch.join(timeout=1.0)


def _forget_in_child() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.set_wakeup_fd(-1)


def _watch(
    read: socket.socket, returned: threading.Event, lock: threading.Lock, end: Callable
) -> None:
    owner = os.getpid()
    with read:
        while data := read.recv(64):
            if signum := next((s for s in data if s in TERMINATING), None):
                _end_if_stuck(signum, owner, returned, lock, end)
                return


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
