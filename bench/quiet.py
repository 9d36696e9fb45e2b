"""Keeping other processes out of the numbers.

On a 2-core machine one busy neighbour (a test run, a build) halves a training job's
speed, and alternating rounds only spreads such noise, it does not remove it. So every
measured command goes through :meth:`Guard.run`: first wait until the machine is idle,
then run, then count the CPU time spent meanwhile that was *not* ours (other processes,
and the hypervisor's steal time, from ``/proc/stat``, minus our own and our reaped
children's CPU time from ``getrusage``). A command disturbed beyond a threshold is run
again; after a few tries its last result is kept and counted as disturbed in RESULTS.md.
"""

from __future__ import annotations

import os
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


@dataclass
class CpuSample:
    wall: float
    busy: float
    """CPU seconds the whole machine was busy (steal included), from /proc/stat."""
    own: float
    """CPU seconds of this process and its reaped children."""


def sample(pool_dir: Path | None = None) -> CpuSample:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    busy = (user + nice + system + irq + softirq + steal) / CLK_TCK
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return CpuSample(time.perf_counter(), busy, own + pool_cpu_s(pool_dir))


POOL_MODULE = b"dtrain_cli.launch.pool_server"


def pool_cpu_s(pool_dir: Path | None) -> float:
    """CPU seconds of the bench's own warm worker pools (those under ``pool_dir``: the
    bench's ``DTRAIN_WARM_POOL_DIR``; another pool on the machine is someone else's work),
    with their reaped children, and of the fork servers they forked (live, or ended and
    not yet reaped: a zombie keeps its times), with theirs: the servers of our launches
    and those launches' workers, not our children but our commands' work."""
    if pool_dir is None:
        return 0.0
    ours = str(pool_dir).encode() + b"/"
    stats: dict[str, list[str]] = {}
    pools = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"{entry.path}/stat").read_text().rsplit(")", 1)[1].split()
            stats[entry.name] = fields
            if fields[3] == entry.name and _is_our_pool(entry.path, ours):
                pools.add(entry.name)  # a pool leads its own session
        except OSError:
            continue
    total = 0
    for pid, fields in stats.items():
        if pid in pools or fields[1] in pools:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / CLK_TCK


def _is_our_pool(proc: str, ours: bytes) -> bool:
    """``python -m dtrain_cli.launch.pool_server <slot> ...`` with its slot under ours."""
    args = Path(f"{proc}/cmdline").read_bytes().split(b"\0")
    return POOL_MODULE in args and any(a.startswith(ours) for a in args)


def foreign_cpu_s(a: CpuSample, b: CpuSample) -> float:
    return max(0.0, (b.busy - a.busy) - (b.own - a.own))


@dataclass
class Guard:
    pool_dir: Path | None = None
    """The bench's own warm pools' folder: their CPU time is ours."""
    max_share: float = 0.04
    """A run is disturbed when others used more than this share of all cores during it..."""
    slack_s: float = 0.04
    """...plus this many CPU seconds (jiffy rounding on short commands)."""
    idle_share: float = 0.10
    probe_s: float = 0.3
    max_wait_s: float = 20.0
    attempts: int = 3
    budget_s: float = 240.0
    """Seconds the suite may spend on waiting and redoing in all; after that it measures
    whatever the machine gives (and counts it as disturbed)."""
    redone: int = 0
    kept_disturbed: list[str] = field(default_factory=list)
    waited_s: float = 0.0
    redo_s: float = 0.0
    last_disturbed: bool = False
    """Whether the result :meth:`run` returned last came from a disturbed run."""

    @property
    def budget_left(self) -> bool:
        return self.waited_s + self.redo_s < self.budget_s

    def wait_for_quiet(self) -> None:
        """Until others use under ``idle_share`` of the cores over ``probe_s``."""
        start = time.perf_counter()
        while self.budget_left and time.perf_counter() - start < self.max_wait_s:
            a = sample(self.pool_dir)
            time.sleep(self.probe_s)
            if foreign_cpu_s(a, sample(self.pool_dir)) < self.idle_share * self.probe_s * NCPU:
                break
        self.waited_s += time.perf_counter() - start

    def disturbed(self, a: CpuSample, b: CpuSample) -> bool:
        capacity = (b.wall - a.wall) * NCPU
        return foreign_cpu_s(a, b) > self.max_share * capacity + self.slack_s

    def run(self, fn: Callable[[], T], what: str, log: Callable[[str], None]) -> T:
        for attempt in range(1, self.attempts + 1):
            self.wait_for_quiet()
            a = sample(self.pool_dir)
            result = fn()
            b = sample(self.pool_dir)
            self.last_disturbed = self.disturbed(a, b)
            if not self.last_disturbed:
                return result
            share = foreign_cpu_s(a, b) / ((b.wall - a.wall) * NCPU)
            log(f"{what}: other processes used {share:.0%} of the CPUs (try {attempt})")
            if attempt == self.attempts or not self.budget_left:
                break
            self.redone += 1
            self.redo_s += b.wall - a.wall
        self.kept_disturbed.append(what)
        return result

    def _kept(self) -> str:
        if not self.kept_disturbed:
            return "none"
        counts = Counter(self.kept_disturbed)
        return ", ".join(f"{what} x{n}" for what, n in counts.items())

    def report(self) -> str:
        return (
            f"runs redone because other processes used the CPUs meanwhile: {self.redone} "
            f"({self.redo_s:.0f} s); kept although disturbed (after {self.attempts} tries or "
            f"with the {self.budget_s:.0f} s retry budget spent): {self._kept()}; "
            f"waited for an idle machine: {self.waited_s:.0f} s in all"
        )
