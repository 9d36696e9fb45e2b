"""The launcher's side of a hang: which ranks are stuck where, which rank is missing.

    DTRAIN_FAULTS="hang:step=7:rank=1" dtrain launch recipe=gpt_tiny dp=2 \\
        debug.collective_timeout_s=10
    error: hang: rank 1 never joined all_reduce #7 (step 7, logging); rank 0 waited in it
           for 10 s; stacks in runs/<run>/logs/hang/

Reads the ``logs/hang/rank_<k>.json`` records the workers' watchdogs wrote
(:mod:`dtrain_cli.runtime.diagnostics.watchdog`). Torch-free.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dtrain_cli.rundir.layout import RunDir


def clear(run_dir: Path) -> None:
    """Before workers start: records of an earlier attempt are stale."""
    shutil.rmtree(RunDir(run_dir).hang, ignore_errors=True)


def read_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(RunDir(run_dir).hang.glob("rank_*.json")):
        try:
            record = json.loads(path.read_text())
            out[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue
    return out


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'; [3] -> 'rank 3'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start = [], ranks[0]
    for prev, cur in zip(ranks, [*ranks[1:], None], strict=True):
        if cur != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur  # type: ignore[assignment]
    return "ranks " + ", ".join(parts)


def hang_report(run_dir: Path, world_size: int) -> str | None:
    """One paragraph naming the ranks behind (never joined the newest collective), those
    waiting in it and those without a record (missing); None when no watchdog fired."""
    records = read_records(run_dir)
    if not records:
        return None
    newest = max(records.values(), key=lambda r: r["collective"]["count"])["collective"]
    count = newest["count"]
    waiting = sorted(
        r
        for r, rec in records.items()
        if rec["collective"]["count"] == count and rec["collective"]["inside"]
    )
    behind = sorted(r for r, rec in records.items() if rec["collective"]["count"] < count)
    missing = [r for r in range(world_size) if r not in records]
    timeout = max(rec.get("timeout_s", 0) for rec in records.values())
    name = f"{newest['op']} #{count} (step {newest['step']}, {newest['what']})"
    parts = []
    if behind:
        where = "; ".join(f"rank {r} at {records[r]['where']}" for r in behind)
        parts.append(f"{_ranks(behind)} never joined {name} ({where})")
    if missing:
        parts.append(f"{_ranks(missing)} wrote no record (exited or unresponsive)")
    if waiting:
        parts.append(f"{_ranks(waiting)} waited in it for {timeout:g} s")
    if not behind and not waiting:
        parts.append(_by_step(records, timeout))
    return f"hang: {'; '.join(parts)}; stacks in {RunDir(run_dir).hang}/"


def _by_step(records: dict[int, dict], timeout: float) -> str:
    """No collective of dtrain's own tells the ranks apart (the wait is inside DDP's
    gradient all-reduce, say): the ranks in the earliest step are the ones behind, the
    others went on to a later step and waited there."""
    steps = sorted({rec["step"] for rec in records.values()})

    def where(ranks: list[int]) -> str:
        return "; ".join(f"rank {r} at {records[r]['where']}" for r in ranks)

    if len(steps) == 1:
        return (
            f"no rank made progress for {timeout:g} s in step {steps[0]} ({where(sorted(records))})"
        )
    behind = sorted(r for r, rec in records.items() if rec["step"] == steps[0])
    ahead = sorted(r for r in records if r not in behind)
    later = sorted({records[r]["step"] for r in ahead})
    return (
        f"{_ranks(behind)} stopped in step {steps[0]} ({where(behind)}); {_ranks(ahead)} went "
        f"on to step {', '.join(map(str, later))} and waited there for {timeout:g} s "
        f"({where(ahead)})"
    )
