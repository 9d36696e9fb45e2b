"""A ``dtrain run`` rank in a SLURM job or a pod passes SIGTERM (a preemption, ``scontrol
requeue``, an eviction) on to itself as the preemption signal, which the guide's scripts
handle by saving a checkpoint (dtrain_cli/runtime/script/worker.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dtrain_cli.runtime.script.worker import sigterm_as_preemption


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # Python runs the handler at the next bytecode boundary


def test_sigterm_in_a_slurm_job_reaches_the_scripts_preemption_handler(handlers, monkeypatch):
    """Under `scontrol requeue` a script that saves on SIGUSR1 (examples/train.py) lost its
    work: SIGTERM ended it (exit 143, no checkpoint), where dtrain's trainer saved one (a new
    user's find)."""
    got = []
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    sigterm_as_preemption("USR1")
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))  # the script's own handler
    _deliver(signal.SIGTERM)
    assert got == [signal.SIGUSR1]


def test_outside_a_scheduler_sigterm_keeps_its_meaning(handlers, monkeypatch):
    for key in ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    before = signal.getsignal(signal.SIGTERM)
    sigterm_as_preemption("USR1")
    assert signal.getsignal(signal.SIGTERM) is before
