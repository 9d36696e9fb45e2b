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
import re
import time
import traceback
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
    *,
    pid: int | None = None,
    attempt: int | None = None,
) -> None:
    """Worker, in its ``except`` (``exc``), a fault drill about to send itself ``signal``,
    or your script's rank about to exit with a non-zero ``exitcode`` (``sys.exit(3)``); or
    the launcher, for worker ``pid`` of restart ``attempt`` found killed by ``signal``.
    Best effort: a note that cannot be written is no error."""
    pid = os.getpid() if pid is None else pid
    text = f"{type(exc).__name__}: {exc}".strip() if exc is not None else ""
    note = {"rank": rank, "pid": pid, "step": step, "time": time.time(), "error": text}
    if exc is not None and (frames := traceback.extract_tb(exc.__traceback__)):
        note["where"] = pick_frame([(f.filename, str(f.lineno), f.name) for f in frames])
    note["attempt"] = restart_count() if attempt is None else attempt
    if signal:
        note["signal"] = signal
    if exitcode is not None:
        note["exitcode"] = exitcode
    try:
        folder = RunDir(Path(run_dir)).failures
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{pid}.json").write_text(json.dumps(note))
    except OSError:
        pass


FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')


def frame_label(path: str, line: int | str | None, function: str) -> str:
    """``models/net.py:42 in forward``: a frame as the failure report names it (the path
    relative to the current directory when under it, else its last three parts)."""
    p = Path(path)
    try:
        shown = str(p.resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        shown = str(Path(*p.parts[-3:])) if len(p.parts) > 3 else str(p)
    return f"{shown}:{line} in {function}"


LIBRARY_PARTS = ("site-packages", "dist-packages", "lib/python3")


def pick_frame(frames: list[tuple[str, str, str]]) -> str | None:
    """Of a traceback's (path, line, function) frames, outermost first: the innermost one
    in your code or dtrain's (not an installed library or the standard library), else the
    innermost of all; labelled as :func:`frame_label` labels it."""
    if not frames:
        return None
    own = [f for f in frames if not any(part in f[0] for part in LIBRARY_PARTS)]
    return frame_label(*(own or frames)[-1])


def innermost_frame(stack: str) -> str | None:
    """:func:`pick_frame` of a formatted traceback (torch's error file); None when the
    text has no frame."""
    frames = [m.groups() for line in stack.splitlines() if (m := FRAME.match(line))]
    return pick_frame(frames)


# What a rank reports when another rank died or stopped answering (gloo, NCCL, the store).
PEER_LOSS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "timed out",
    "timeout",
    "socket timeout",
    "distnetworkerror",
    "remote process exited",
    "communicator was aborted",
)
OWN_SOCKET = ("address already in use", "eaddrinuse")
"""A rank that could not listen on a port (``DistNetworkError ... EADDRINUSE``): its own
failure, not a lost peer."""


def is_peer_loss(error: str) -> bool:
    """Whether an error's text is what a rank reports when another rank died or stopped
    answering (:data:`PEER_LOSS`), not a failure of its own (:data:`OWN_SOCKET`) nor the
    naming of ranks that never came (:func:`not_arrived`)."""
    text = error.lower()
    if any(p in text for p in OWN_SOCKET) or not_arrived(error) is not None:
        return False
    return any(p in text for p in PEER_LOSS)


NOT_ARRIVED = (
    "init_process_group: rank(s) {ranks} of {world} did not arrive within {seconds:g} s "
    "(launcher.rdzv_timeout_s); see logs/rank_{first}.log"
)
"""What a ``dtrain run`` rank raises when others never reached ``init_process_group``
(:mod:`dtrain_cli.runtime.script.arrival`); the launcher names those ranks from it."""
_NOT_ARRIVED = re.compile(r"rank\(s\) ([\d, ]+) of \d+ did not arrive within (\S+) s")


def not_arrived(error: str) -> tuple[list[int], str] | None:
    """(the ranks that never came, the seconds waited) of a :data:`NOT_ARRIVED` error."""
    found = _NOT_ARRIVED.search(error)
    if found is None:
        return None
    return [int(r) for r in found.group(1).split(",")], found.group(2)


def attempt_cause(run_dir: Path, attempt: int, world_size: int | None = None) -> str:
    """What ended restart attempt ``attempt``, from its ranks' notes (a restarted group
    says it): a rank killed by a signal, else an error of a rank's own, else the ranks of
    ``world_size`` that left no note (killed without a drill: a real SIGKILL writes none),
    whose peers then lost them. Short of the launcher's report
    (:mod:`dtrain_cli.launch.failures`), which sees exit codes."""
    notes = [n for n in _all_notes(run_dir) if n.get("attempt", 0) == attempt]
    notes.sort(key=lambda n: float(n.get("time", 0)))

    def after(n: dict[str, Any]) -> str:
        return "" if n.get("step") is None else f" after step {n['step']}"

    for n in notes:
        if n.get("signal"):
            return f"rank {n['rank']} was killed by {n['signal']}{after(n)}"
    for n in notes:
        error = str(n.get("error", "")).split("\n")[0]
        if error and not is_peer_loss(error):
            return f"rank {n['rank']} failed{after(n)}: {error}"
    if notes:
        lost = ", ".join(str(n["rank"]) for n in notes)
        noted = {int(n["rank"]) for n in notes}
        silent = [r for r in range(world_size or 0) if r not in noted]
        if silent:
            who = ("rank " if len(silent) == 1 else "ranks ") + ", ".join(map(str, silent))
            return (
                f"{who} ended without an error of its own{after(notes[0])} (killed by a "
                f"signal?); rank(s) {lost} then lost a peer"
            )
        return f"rank(s) {lost} lost a peer{after(notes[0])} (another rank was killed?)"
    return "a worker failed"


def _all_notes(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in RunDir(Path(run_dir)).failures.glob("*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


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
