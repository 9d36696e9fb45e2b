"""An agent blocked in torch's exit barrier (a ``TCPStore.wait``) ends on SIGTERM instead of
waiting for SIGKILL (dtrain_cli/launch/exit_barrier.py). In-process: this test's main
thread waits in a real TCPStore; the end callback records and releases it."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import torch.distributed as dist

from dtrain_cli.launch import exit_barrier


def _blocked_wait(store: dist.TCPStore) -> float:
    start = time.monotonic()
    store.wait(["barrier-done"])  # returns when the key is set, or raises at the timeout
    return time.monotonic() - start


def test_a_signal_during_a_blocking_store_wait_ends_the_launch(monkeypatch):
    monkeypatch.setattr(exit_barrier, "SETTLE_S", 0.5)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    other = dist.TCPStore("127.0.0.1", store.port, 1, False)  # another agent's client
    ended: list[int] = []

    def end(signum: int) -> None:  # the launcher reports and exits; here: note and release
        ended.append(signum)
        other.set("barrier-done", "1")

    handled: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: handled.append(s))  # torch's agent
    try:
        with exit_barrier.end_when_signalled_at_exit_barrier(end):
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
            waited = _blocked_wait(store)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ended == [signal.SIGTERM]
    assert 0.5 < waited < 10  # after the settling time, long before the store's 30 s
    assert handled == [signal.SIGTERM]  # the agent's own handler ran too, once unblocked
    assert signal.set_wakeup_fd(-1) == -1  # nothing left installed


def test_a_launch_that_returns_by_itself_is_never_ended(monkeypatch):
    monkeypatch.setattr(exit_barrier, "SETTLE_S", 0.2)
    ended: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: None)
    try:
        with exit_barrier.end_when_signalled_at_exit_barrier(ended.append):
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once: the launch returns
        time.sleep(0.6)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ended == []


def test_another_wakeup_fd_reader_keeps_its_fd():
    import socket

    a, b = socket.socketpair()
    b.setblocking(False)
    signal.set_wakeup_fd(b.fileno())
    try:
        with exit_barrier.end_when_signalled_at_exit_barrier(lambda s: None):
            assert signal.set_wakeup_fd(b.fileno()) == b.fileno()
    finally:
        signal.set_wakeup_fd(-1)
        a.close()
        b.close()
