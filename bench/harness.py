"""Shared plumbing: a scratch workspace, timed subprocesses, statistics, markdown tables."""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from proctree import StepCpuWatch, wait_watching
from quiet import Guard

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
"""The venv's bin folder (``make bench`` runs ``.venv/bin/python bench/run.py``)."""
PLAIN_SCRIPT = REPO / "bench" / "plain_ddp.py"
EN_DASH = "\u2013"  # in ranges: median (min<en dash>max)
# Variables that would change what the measured programs do, dropped from their env.
SCRUBBED_ENV = (
    "OMP_NUM_THREADS",
    "DTRAIN_LAUNCH_T0",
    "BENCH_T0",
    "DTRAIN_FAULTS",
    "DTRAIN_WARM_POOL",
    "DTRAIN_WARM_POOL_IDLE_S",
)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Workspace:
    """Scratch dirs for one suite run: run dirs, data cache, captured output."""

    root: Path
    quick: bool
    rounds: int = 0
    """``--rounds N``: the hf and custom sections' rounds (of 200 steps); 0: their own."""
    counter: int = 0
    guard: Guard = field(default_factory=Guard)
    failures: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, quick: bool, rounds: int = 0) -> Workspace:
        root = Path(tempfile.mkdtemp(prefix="dtrain-bench-"))
        guard = Guard(budget_s=60.0 if quick else 360.0, pool_dir=root / "pool")
        return cls(root, quick, rounds=rounds, guard=guard)

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def pool(self) -> Path:
        where = self.root / "pool"
        where.mkdir(mode=0o700, exist_ok=True)
        return where

    def next_name(self, label: str) -> str:
        self.counter += 1
        return f"{label}-{self.counter:03d}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
        env["DTRAIN_CACHE"] = str(self.cache)
        env["DTRAIN_WARM_POOL_DIR"] = str(self.pool)  # the bench's own warm pool
        env.update(extra)
        return env


@dataclass
class Cmd:
    """A command line and the env variables it is shown (and run) with."""

    argv: list[str]
    shown_env: dict[str, str] = field(default_factory=dict)
    t0_var: str | None = None
    """Set to the epoch time just before the process starts (``DTRAIN_LAUNCH_T0``...)."""

    def shell(self) -> str:
        env = dict(self.shown_env)
        if self.t0_var:
            env[self.t0_var] = "$(date +%s.%N)"
        prefix = " ".join(
            f"{k}={v if v.startswith('$(') else shlex.quote(v)}" for k, v in env.items()
        )
        return f"{prefix} {shlex.join(self.argv)}".strip()

    def shown(self, ws: Workspace) -> str:
        """The command as RESULTS.md shows it: ``$REPO``, ``$W`` for the folders, and the
        data cache variable every command gets."""
        text = f"DTRAIN_CACHE=$W/cache {self.shell()}"
        return text.replace(str(ws.root), "$W").replace(str(REPO), "$REPO")


@dataclass
class Finished:
    wall_s: float
    stdout: str
    cpu_s: float | None = None
    """CPU seconds of the process tree between the two watched step lines, if asked."""


class CommandFailed(RuntimeError):
    pass


def guarded(ws: Workspace, fn: Callable[[], T], what: str) -> T:
    """``fn()`` on an idle machine, redone if other processes got in the way; a command
    that fails is run once more (a neighbour's test may kill or starve it) and noted."""

    def with_one_retry() -> T:
        try:
            return fn()
        except CommandFailed as exc:
            ws.failures.append(f"{what}: {str(exc).splitlines()[-1][:200]}")
            log(f"{what} failed, running it again: {exc}")
            return fn()

    return ws.guard.run(with_one_retry, what, log)


def run_guarded(cmd: Cmd, ws: Workspace, what: str) -> Finished:
    """:func:`run_timed` through :func:`guarded`."""
    return guarded(ws, lambda: run_timed(cmd, ws), what)


def run_timed(
    cmd: Cmd, ws: Workspace, cpu_between: tuple[int, int] | None = None, timeout_s: float = 600.0
) -> Finished:
    """Run ``cmd`` in the workspace; wall time from just before start to exit. With
    ``cpu_between=(a, b)``, also the process tree's CPU time from its ``step a`` log line
    to its ``step b`` line."""
    env = ws.env(**cmd.shown_env)
    out_path = ws.root / f"out-{ws.next_name('cmd')}.txt"
    watch = StepCpuWatch(*cpu_between) if cpu_between else StepCpuWatch(-1, -1)
    with out_path.open("w") as out, out_path.open() as reader:
        if cmd.t0_var:
            env[cmd.t0_var] = repr(time.time())
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd.argv, cwd=ws.root, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        code = wait_watching(proc, reader, watch, timeout_s)
        wall = time.perf_counter() - start
    text = out_path.read_text()
    if code != 0:
        tail = "\n".join(text.splitlines()[-25:])
        raise CommandFailed(f"exit code {code}: {cmd.shell()}\n{tail}")
    return Finished(wall, text, watch.cpu_s())


def interleaved(rounds: int, programs: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(round, program), programs alternating; the order flips every round (a b, b a, ...)
    so a slow drift of the machine hits every program equally."""
    for r in range(rounds):
        order = programs if r % 2 == 0 else list(reversed(programs))
        for name in order:
            yield r, name


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """``median (min<en dash>max)``."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(median(values))} ({fmt(min(values))}{EN_DASH}{fmt(max(values))})"


def used_rounds(*clean: Sequence[bool]) -> list[int]:
    """Indices of the rounds whose runs were all undisturbed by other processes, when
    there are 2 or more; else every round."""
    n = len(clean[0])
    ok = [i for i in range(n) if all(c[i] for c in clean)]
    return ok if len(ok) >= 2 else list(range(n))


def rounds_label(*clean: Sequence[bool]) -> str:
    """``5``, ``4 of 5`` (one round left out as disturbed) or ``5, 4 disturbed``."""
    n = len(clean[0])
    ok = sum(all(c[i] for c in clean) for i in range(n))
    if ok == n:
        return str(n)
    return f"{ok} of {n}" if ok >= 2 else f"{n}, {n - ok} disturbed"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Section:
    """One benchmark's part of RESULTS.md."""

    title: str
    what: str
    table: str
    commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        parts = [f"## {self.title}", self.what, self.table]
        if self.notes:
            parts.append("\n".join(f"- {n}" for n in self.notes))
        if self.commands:
            parts.append("Commands (one round; `$W` is the scratch folder):")
            parts.append("```sh\n" + "\n".join(self.commands) + "\n```")
        return "\n\n".join(parts)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _nproc() -> str:
    try:
        return subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return str(os.cpu_count())


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip()


def _torch_version() -> str:
    code = "import torch; print(torch.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def machine_lines() -> list[str]:
    dirty = " (working tree with uncommitted changes)" if _git("status", "--porcelain") else ""
    return [
        f"- `nproc`: {_nproc()}",
        f"- CPU: {_cpu_model()}",
        f"- torch {_torch_version()}, Python {platform.python_version()}, {platform.platform()}",
        f"- dtrain commit {_git('rev-parse', '--short', 'HEAD')}{dirty}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
    ]


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
