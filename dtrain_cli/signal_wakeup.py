"""Signals seen at once, even while the main thread waits inside C code.

Python runs a signal's handler only between two bytecodes of the main thread: a process
blocked in a C call (a c10d store wait, a collective) acts on the signal only when that
call returns. The C-level trampoline also writes the signal's number to the wakeup fd
(:func:`signal.set_wakeup_fd`) at once, for every signal that has a Python handler;
:func:`watch_signals` has a thread read it and call back. A worker's Ctrl-C bound
(:mod:`dtrain_cli.runtime.diagnostics.interrupt`) and the launcher's exit barrier
(:mod:`dtrain_cli.launch.exit_barrier`) are built on it. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

_OURS: set[int] = set()
"""The write ends installed here: a process forked from this one drops them (its signals
are its own, not for this process's thread)."""


def _drop_inherited() -> None:
    if threading.current_thread() is threading.main_thread():
        inherited = signal.set_wakeup_fd(-1)
        if inherited != -1 and inherited not in _OURS:  # not ours: it stays
            signal.set_wakeup_fd(inherited)


os.register_at_fork(after_in_child=_drop_inherited)


def watch_signals(
    on_signals: Callable[[frozenset[int]], bool], *, replace: bool = True
) -> Callable[[], None] | None:
    """From the main thread: ``on_signals(numbers)`` in a thread for each batch of signals
    read, until it returns True or the returned ``stop()`` is called. None (nothing
    installed): not the main thread, or ``replace=False`` and another reader has the fd."""
    if threading.current_thread() is not threading.main_thread():
        return None
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous != -1 and not replace:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return None
    _OURS.add(write)

    def watch() -> None:
        with contextlib.suppress(OSError), open(read, "rb", buffering=0) as pipe:
            while data := pipe.read(64):
                if on_signals(frozenset(data)):
                    return

    thread = threading.Thread(target=watch, name="dtrain-signal-wakeup", daemon=True)
    thread.start()

    def stop() -> None:
        current = signal.set_wakeup_fd(-1)
        if current not in (write, -1):  # someone else's since: it stays
            signal.set_wakeup_fd(current)
        _OURS.discard(write)
        os.close(write)  # the thread reads the end
        if threading.current_thread() is not thread:
            thread.join(timeout=1.0)

    return stop
