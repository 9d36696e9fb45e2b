"""Fault injection for recovery drills: make a chosen rank die at a chosen point.

    DTRAIN_FAULTS="kill:step=13:rank=1" dtrain launch recipe=gpt_tiny dp=2 launcher.max_restarts=1
    DTRAIN_FAULTS="hang:step=2:rank=1" dtrain launch recipe=gpt_tiny dp=2 \
        launcher.collective_timeout_s=10

Points: ``kill`` (end of a training step) and ``kill_in_save`` (while a checkpoint's
temporary folder is being written): the process dies by SIGKILL, as on a lost node;
``hang`` (end of a training step): the process stays alive but never reaches the next
collective, as on a stuck device (its peers fail after ``launcher.collective_timeout_s``).
A fault fires on the first attempt only, so an elastic restart can show that the run
recovers.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "DTRAIN_FAULTS"


def _parse(spec: str) -> list[tuple[str, dict[str, int]]]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, *args = item.split(":")
        params = {k: int(v) for k, v in (a.split("=", 1) for a in args)}
        out.append((name, params))
    return out


_FAULTS = _parse(os.environ.get(ENV, ""))


def maybe_fail(point: str, **where: int) -> None:
    """SIGKILL this process if a fault is armed for ``point`` at ``where`` (first attempt)."""
    if not _FAULTS or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    for name, params in _FAULTS:
        at = "kill" if name == "hang" else name  # a hang fires where kill does
        if at == point and all(where.get(k) == v for k, v in params.items()):
            if name == "hang":  # frozen: alive, silent (a real hang leaves no note)
                while True:
                    time.sleep(3600)
            _note_drill(name, where)
            os.kill(os.getpid(), signal.SIGKILL)


def _note_drill(name: str, where: dict[str, int]) -> None:
    """A drill says what it did (a real SIGKILL leaves no trace): the launcher's report
    then names the signal (:mod:`dtrain_cli.runtime.failure_notes`)."""
    run_dir = os.environ.get("DTRAIN_RUN_DIR")
    if run_dir:
        from pathlib import Path

        from dtrain_cli.runtime.failure_notes import write_note

        step = where.get("step")
        write_note(Path(run_dir), int(os.environ.get("RANK", "-1")), step, None, "SIGKILL")


def straggle(rank: int, step_s: float) -> None:
    """``slow:rank=R:factor=F``: rank R sleeps (F - 1) x its step time after every step, a
    worker F times slower (for the staleness drills). Every attempt, unlike the others."""
    for name, params in _FAULTS:
        if name == "slow" and params.get("rank", rank) == rank and params.get("factor", 1) > 1:
            time.sleep((params["factor"] - 1) * step_s)
