"""CPU time of a running program's whole process tree (agent and workers, every thread),
taken between two points of its output: the ``step A`` and ``step B`` log lines.

Wall time on a shared 2-core machine swings with the neighbours; CPU time per step barely
does (no OpenMP spinning with 1 thread per process; gloo waits block), so it is the steadier
measure of how much work each program does per step. Linux only (``/proc``); nanosecond
resolution from ``/proc/<pid>/task/<tid>/schedstat``.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# dtrain prints "step 10/60  loss ..."; plain_ddp.py prints "step 10 loss ...".
STEP_LINE = re.compile(r"^step (\d+)[/ ]", re.MULTILINE)
POLL_S = 0.005
POOL_MODULE = b"dtrain_cli.launch.pool_server"


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _process_cpu_s(pid: int) -> float:
    total = 0
    try:
        tasks = list(os.scandir(f"/proc/{pid}/task"))
    except OSError:
        return 0.0
    for task in tasks:
        try:
            total += int(Path(f"{task.path}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _pool_servers(children: dict[int, list[int]]) -> list[int]:
    """The fork servers dtrain's warm worker pools forked for the launch that runs (a pool's
    children; the bench runs one program at a time): the launch's workers are theirs, not
    the launcher's. The pool itself, idle while a launch trains, is not counted."""
    out = []
    for pids in children.values():
        for pid in pids:
            try:
                session = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]
                if session == str(pid) and POOL_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.extend(children.get(pid, []))  # a pool leads its own session
            except (OSError, IndexError):
                continue
    return out


def tree_cpu_s(root: int) -> float:
    """CPU seconds so far of ``root`` and its live descendants, all threads, and of the
    servers a warm worker pool forked for it."""
    children, total = _children(), 0.0
    stack = [root, *_pool_servers(children)]
    while stack:
        pid = stack.pop()
        total += _process_cpu_s(pid)
        stack.extend(children.get(pid, []))
    return total


@dataclass
class StepCpuWatch:
    """Polls a program's output file while it runs; snapshots the tree's CPU time when the
    log line of step ``start`` and of step ``end`` appear."""

    start: int
    end: int
    seen: dict[int, float] = field(default_factory=dict)
    _text: str = ""

    def poll(self, out: IO[str], pid: int) -> None:
        self._text += out.read()
        if self.end in self.seen:
            return
        steps = {int(m) for m in STEP_LINE.findall(self._text)}
        for step in (self.start, self.end):
            if step in steps and step not in self.seen:
                self.seen[step] = tree_cpu_s(pid)

    def cpu_s(self) -> float | None:
        if self.start in self.seen and self.end in self.seen:
            return self.seen[self.end] - self.seen[self.start]
        return None


def wait_watching(
    proc: subprocess.Popen[bytes], out: IO[str], watch: StepCpuWatch, timeout_s: float
) -> int:
    """Wait for ``proc``, feeding its output (a file opened for reading) to ``watch``."""
    deadline = time.perf_counter() + timeout_s
    while proc.poll() is None:
        if time.perf_counter() > deadline:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        watch.poll(out, proc.pid)
        time.sleep(POLL_S)
    return proc.returncode
