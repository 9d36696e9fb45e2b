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


def test_a_script_without_a_handler_for_the_signal_is_ended_by_sigterm_as_before(
    handlers, monkeypatch
):
    """Passed on as SIGUSR1 to a script that does not handle it, SIGTERM became 'killed by
    SIGUSR1' (the preemption signal's message) for ranks the agent stops after a peer's
    crash (a review's find). The handler gives SIGTERM back its default and sends it."""
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(sig))
    sigterm_as_preemption("USR1")
    signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
    assert sent == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize(("name", "on_sigterm"), [("TERM", True), ("USR1", False)])
def test_sigterm_is_left_alone_when_it_is_the_signal_or_the_config_says_so(
    name, on_sigterm, handlers, monkeypatch
):
    """cluster.signal=TERM sent SIGTERM to itself forever (a RecursionError); and
    cluster.checkpoint_on_sigterm=false is honoured, as the trainer honours it."""
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    before = signal.getsignal(signal.SIGTERM)
    sigterm_as_preemption(name, on_sigterm)
    assert signal.getsignal(signal.SIGTERM) is before
