"""A failing worker's note for the launcher: which step it was at, and when, precisely.

    <run>/logs/failures/<pid>.json   {"rank": 1, "step": 12, "time": 1764578713.52, ...}

torch elastic's error file (``@record``) keeps the traceback but a timestamp in whole
seconds and no step; the launcher (:mod:`dtrain_cli.launch.failures`) matches a note to
the agent's failure by pid. A rank killed by a signal writes none (a fault drill writes
the signal it is about to send); your script's rank notes its exit code. Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dtrain_cli.rundir.env import restart_count
from dtrain_cli.rundir.layout import RunDir


def write_note(
    run_dir: Path,
    rank: int,
    step: int | None,
    exc: BaseException | None,
    signal: str | None = None,
    exitcode: int | None = None,
) -> None:
    """Worker, in its ``except`` (``exc``), a fault drill about to send itself ``signal``,
    or your script's rank about to exit with a non-zero ``exitcode`` (``sys.exit(3)``).
    Best effort: a note that cannot be written is no error."""
    text = f"{type(exc).__name__}: {exc}".strip() if exc is not None else ""
    note = {"rank": rank, "pid": os.getpid(), "step": step, "time": time.time(), "error": text}
    note["attempt"] = restart_count()
    if signal:
        note["signal"] = signal
    if exitcode is not None:
        note["exitcode"] = exitcode
    try:
        folder = RunDir(Path(run_dir)).failures
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{os.getpid()}.json").write_text(json.dumps(note))
    except OSError:
        pass


def read_notes(run_dir: Path, since: float = 0.0) -> dict[int, dict[str, Any]]:
    """pid -> note, for the notes written after ``since`` by the latest restart attempt."""
    out: dict[int, dict[str, Any]] = {}
    for path in RunDir(Path(run_dir)).failures.glob("*.json"):
        try:
            note = json.loads(path.read_text())
            if float(note["time"]) >= since:
                out[int(note["pid"])] = note
        except (OSError, ValueError, KeyError, TypeError):
            continue
    last = max((n.get("attempt", 0) for n in out.values()), default=0)
    return {pid: n for pid, n in out.items() if n.get("attempt", 0) == last}
