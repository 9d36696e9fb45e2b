"""How dtrain's processes signal each other: exit codes, signals and the markers in a run dir.

    kill -USR1 <dtrain pid>    # workers checkpoint, rank 0 writes preempted.json, exit 75

- exit codes: :data:`EXIT_PREEMPTED` (75, checkpoint saved: requeue), :data:`EXIT_HANG`
  (124, a hang watchdog ended the run), :data:`EXIT_INTERRUPTED` (130, Ctrl-C);
- signals: the preemption signal's names (``cluster.signal``) and the signals a scheduler
  sends every process of a job step (:data:`STEP_SIGNALS`);
- markers: ``preempted.json`` (rank 0, after the preemption checkpoint; the launcher turns
  it into exit 75), ``first_step.json`` (rank 0, after step 1: the run trained, the launcher
  keeps its dir), ``slurm/FINISHED`` (``dtrain agent``: the run completed).
Torch-free.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

from dtrain_cli.rundir.layout import RunDir

EXIT_CONFIG = 2
"""Bad input (a config, a run dir that holds another run): one line said, nothing run; a
scheduler should not retry it (the JobSet fails at once)."""
EXIT_PREEMPTED = 75
"""Exit code of a run stopped by preemption with its checkpoint saved (EX_TEMPFAIL)."""
EXIT_HANG = 124
"""A worker's hang watchdog ended the run (as ``timeout`` exits)."""
EXIT_INTERRUPTED = 130
"""Stopped by SIGINT (Ctrl-C): 128 + 2."""
SIGNAL_NAMES = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "CONT", "URG", "XCPU")
STEP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""What a scheduler may send to every process of a job step (SLURM: the preemption signal
to the whole step, TERM at the time limit): helpers that must outlive the workers (the
fork server) ignore these."""
TEE_PROCESS_NAME = b"dtrain-tee"
"""``/proc/<pid>/comm`` of a ``dtrain run`` rank's tee (:mod:`dtrain_cli.runtime.script.tee`),
which the launcher lets finish its rank's last lines before it ends what is left."""


def signal_number(name: str) -> int:
    """``USR1``/``SIGUSR1``/``10`` -> 10; ValueError naming what is allowed."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    short = text.removeprefix("SIG")
    if short not in SIGNAL_NAMES:
        raise ValueError(f"signal {name!r} is not supported; use one of {', '.join(SIGNAL_NAMES)}")
    return int(getattr(signal, f"SIG{short}"))


# -- which process a rank is: the first line of its log ---------------------------------------
PID_LINE = "rank {rank} pid {pid} on {host}"
"""Every worker's log starts (each attempt) with this line: a person or the launcher finds
rank k's process by it."""
_PID_RE = re.compile(r"rank (\d+) pid (\d+) on (\S+)")


def rank_process(run: RunDir, rank: int) -> tuple[int, str] | None:
    """(pid, host) of ``rank``'s latest attempt, from its log; None when it wrote none."""
    try:
        text = run.rank_log(rank).read_text(errors="replace")
    except OSError:
        return None
    found = [m for m in _PID_RE.finditer(text) if int(m.group(1)) == rank]
    return (int(found[-1].group(2)), found[-1].group(3)) if found else None


def _write_json(path: Path, data: dict[str, Any], tag: str = "") -> None:
    """Atomically (a reader never sees half a marker)."""
    tmp = path.with_name(f".{path.name}{tag}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- preemption ------------------------------------------------------------------------------
def write_preempted(run: RunDir, info: dict[str, Any], *, writer: int = 0) -> None:
    """After the preemption checkpoint (dtrain's rank 0, or your script's rank ``writer``
    that exited 75)."""
    _write_json(run.preempted, info, tag=f".{writer}")


def read_preempted(run: RunDir) -> dict[str, Any] | None:
    return _read_json(run.preempted)


def clear_preempted(run: RunDir) -> None:
    """Launcher, before starting workers: a marker from an earlier attempt is stale."""
    run.preempted.unlink(missing_ok=True)


# -- a script run's end -------------------------------------------------------------------------
def write_finished(run: RunDir) -> None:
    """Launcher: a ``dtrain run`` script's run ended well (``dtrain resume`` refuses it)."""
    _write_json(run.finished, {"exit_code": 0, "time": time.time()})


def read_finished(run: RunDir) -> dict[str, Any] | None:
    return _read_json(run.finished)


# -- the first step ----------------------------------------------------------------------------
def write_first_step(run: RunDir, info: dict[str, Any]) -> None:
    """Rank 0, when its first optimizer step finished (once per run dir)."""
    if not run.first_step.exists():
        _write_json(run.first_step, {**info, "time": time.time()})


def trained(run: RunDir) -> bool:
    """Some attempt finished an optimizer step in this run dir."""
    return run.first_step.is_file()


# -- completion (dtrain agent, under SLURM) ----------------------------------------------------
def mark_finished(run: RunDir) -> None:
    run.slurm.mkdir(exist_ok=True)
    if not run.slurm_finished.exists():
        run.slurm_finished.write_text(time.strftime("%c\n"))
