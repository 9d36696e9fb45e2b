"""The launcher's side of ``dtrain run train.py``: what the agent starts, what a failure says.

    dtrain run dp=2 -- train.py --epochs 3

The same elastic agent, rendezvous, restarts, signal forwarding and run dir as a recipe's
launch (:mod:`.local`); only the workers' entry differs. ``forkserver`` (default) and
``fork``: torch's function entry, :func:`dtrain_cli.runtime.script.worker.script_main`,
in workers forked with torch imported (the first step comes sooner than under torchrun).
``spawn``: a fresh ``python -u`` per rank, as torchrun starts it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dtrain_cli
from dtrain_cli.launch.preload import SCRIPT_ENTRY, SCRIPT_MODULE, entry_point
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir

TAIL_LINES = 12


def script_entry(
    run_dir: Path, plan: Plan, signals_to_handle: str
) -> tuple[Callable[..., Any] | str, tuple]:
    """(entrypoint, args) for ``elastic_launch``. A worker forked from the fork server gets
    the agent's environment as torchrun's workers would see it (they inherit the agent's):
    what the launcher set after the server started, and what torch's ``launch_agent``
    sets (``TORCHELASTIC_SIGNALS_TO_HANDLE``)."""
    import os

    from dtrain_cli.launch import worker_server

    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = signals_to_handle  # as launch_agent will
    if plan.start_method == "spawn":
        return spawn_command(plan), ("-u", "-c", spawn_code(), str(run_dir))
    return entry_point(SCRIPT_ENTRY), (str(run_dir), worker_server.env_changes())


def spawn_command(plan: Plan) -> str:
    """The interpreter each rank starts: ``launcher.python``, or dtrain's own."""
    return (plan.script.python if plan.script else None) or sys.executable


def spawn_code() -> str:
    """``python -u -c CODE RUN_DIR``: the script worker imported from dtrain's folder and
    (for pyyaml, after the interpreter's own packages) dtrain's site-packages, both gone
    from ``sys.path`` again before the script starts."""
    import yaml

    paths = [str(Path(dtrain_cli.__file__).parent.parent), str(Path(yaml.__file__).parents[1])]
    return (
        f"import sys; extra = [p for p in {paths!r} if p not in sys.path]; "
        f"sys.path.extend(extra); import {SCRIPT_MODULE} as w; "
        "[sys.path.remove(p) for p in extra]; w.main()"
    )


def script_failure(failed: list[Any], run_dir: Path, plan: Plan) -> tuple[int, str]:
    """(exit code, report) of a failed script run: which rank failed first
    (:func:`dtrain_cli.launch.failures.describe`), with each rank's error as its log shows
    it: python's own traceback of the script, or its last lines (``sys.exit(3)``). A
    missing module names the interpreter the script ran under."""
    from dtrain_cli.launch import failures

    for f in failed:
        if f.silent or f.signal is not None:
            continue
        tail = failure_tail(run_dir, f.rank)
        if tail:
            f.headline, _, f.detail = tail.partition("\n")
            f.detail = f.detail or f.headline
        # no traceback: the script ended itself, its last line is no error message
        f.exited = f.exitcode is not None and "Traceback (most recent" not in (tail or "")
        if f.exited and not tail:
            f.headline = f.detail = ""
    code, text = failures.describe(failed, steps_known=False, multi_node=plan.nnodes > 1)
    first, nl, rest = text.partition("\n")
    if "ModuleNotFoundError" in first:
        first += (
            f"; the script ran under {spawn_command(plan)} (a package of another "
            "environment: install it there, or launcher.python=/path/to/its/bin/python)"
        )
    return code, first + nl + rest


def traceback_block(lines: list[str]) -> list[str]:
    """A traceback from its header to its exception line (the first line after the header
    that is not an indented frame): stdout and stderr reach the log through two pipes, so
    a line the script printed before raising can land after its traceback."""
    for i, line in enumerate(lines[1:], start=1):
        if line and not line[0].isspace():
            return lines[: i + 1]
    return lines


def failure_tail(run_dir: Path, rank: int) -> str | None:
    """The failing rank's last line (the exception, or what it printed last), then its
    last traceback (or last lines) from ``logs/rank_<k>.log``."""
    path = RunDir(run_dir).rank_log(rank)
    try:
        text = path.read_text(errors="replace")
        for _ in range(5):  # the log's last lines may still be on their way (a loaded machine)
            if "Traceback (most recent" in text:
                break
            time.sleep(0.2)
            newer = path.read_text(errors="replace")
            if newer == text:
                break
            text = newer
    except OSError:
        return None
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    tail = traceback_block(lines[starts[-1] :]) if starts else lines
    tail = [line for line in tail[-TAIL_LINES:] if line.strip()]
    if not tail:
        return None
    return "\n".join([tail[-1].strip(), *tail]) if len(tail) > 1 else tail[0].strip()
