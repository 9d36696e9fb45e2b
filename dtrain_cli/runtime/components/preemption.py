"""Preemption: a signal asks every rank to checkpoint at the next logging step, then stop.

    dtrain launch recipe=gpt_tiny dp=2 train.steps=100000 &
    kill -USR1 <pid of dtrain>     # -> checkpoint at a step boundary, exit code 75
    dtrain resume --ckpt runs/<run>   # or, under SLURM, the job requeues itself

The signal handler only sets a flag (no I/O, no collective, no checkpoint: a handler runs
between two bytecodes of whatever the main thread was doing, possibly inside a collective).
The trainer reads :func:`requested` on every rank at every logging step and sums it over
the WORLD group inside the all-reduce it already makes there (with the loss), so every rank
stops at the same step even when only some got the signal (a rank of another dp group, a
node SLURM signalled late), at no extra collective or host sync; the stop comes at most
``logging.every`` steps after the signal (size SLURM's ``cluster.signal_lead_s`` for
that plus one checkpoint). Rank 0 then writes ``preempted.json`` beside the checkpoint;
the launcher turns it into exit code :data:`EXIT_PREEMPTED`.

The protocol's constants and the marker live in :mod:`dtrain_cli.rundir.protocol`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import signal_number


class PreemptionWatcher:
    """Remembers that a watched signal arrived. ``install`` once per process, in the main
    thread; ``requested`` is cheap and local (no collective)."""

    def __init__(self) -> None:
        self.installed = False
        self.signum: int | None = None

    def install(self, signals: Iterable[str | int]) -> None:
        for sig in signals:
            num = sig if isinstance(sig, int) else signal_number(sig)
            signal.signal(num, self._handle)
        self.installed = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum  # only the flag: the trainer acts at the next step boundary

    def requested(self) -> bool:
        return self.signum is not None


WATCHER = PreemptionWatcher()


def watched_signals(signal_name: str, checkpoint_on_sigterm: bool) -> list[str]:
    """The configured signal, plus SIGTERM inside a SLURM job (preemption, scontrol requeue,
    the time limit) or a Kubernetes pod (its deletion or eviction: the kubelet's SIGTERM
    reaches the agent, which stops its workers with it) when ``checkpoint_on_sigterm``.
    Elsewhere SIGTERM keeps its meaning (the local launcher's Ctrl-C stops workers with it)."""
    out = [signal_name] if signal_name else []
    if checkpoint_on_sigterm and env.in_scheduler_job():
        out.append("TERM")
    return out


def install(signal_name: str, checkpoint_on_sigterm: bool = True) -> None:
    """Worker start: watch the run's preemption signal(s) (every rank must call this)."""
    WATCHER.install(watched_signals(signal_name, checkpoint_on_sigterm))


def requested() -> bool:
    """This rank was signalled. The trainer adds it to the small vector it all-reduces at
    every logging step (with the loss), so every rank agrees without a collective of its own."""
    return WATCHER.installed and WATCHER.requested()


def preempted(run_dir: Path, step: int, rank: int) -> dict[str, Any]:
    """Trainer hook after the preemption checkpoint: rank 0 writes the marker the launcher
    turns into :data:`EXIT_PREEMPTED`. Returns the worker's result."""
    info = {"preempted": True, "step": step, "signal": WATCHER.signum, "time": time.time()}
    if rank == 0:
        protocol.write_preempted(RunDir(run_dir), info)
    return info
