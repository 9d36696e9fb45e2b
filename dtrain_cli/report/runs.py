"""A run dir as data: its metrics.jsonl records and summary.json, checked on the way in.

dtrain report runs/<run>
dtrain compare runs/<dp2-run> runs/<pp2-run>
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtrain_cli.rundir.layout import RunDir


class RunDirError(ValueError):
    """Not a run dir, or nothing to read (one line for the CLI, exit 2)."""


@dataclass
class RunData:
    path: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    def series(self, key: str, kind: str = "train") -> tuple[list[int], list[float]]:
        rows = [r for r in self.kind(kind) if isinstance(r.get(key), (int, float))]
        return [int(r["step"]) for r in rows], [float(r[key]) for r in rows]

    def losses(self) -> dict[int, float]:
        steps, values = self.series("loss")
        return dict(zip(steps, values, strict=True))

    def loss_windows(self) -> dict[int, tuple[float, int]]:
        """Logged step -> (its loss, the steps it averages). A logged loss is the mean over
        the window since the previous logged step (``loss_steps``: the steps in it that
        counted; older runs: the window's length)."""
        out: dict[int, tuple[float, int]] = {}
        for r in self.kind("train"):
            if isinstance(r.get("loss"), (int, float)):
                out[int(r["step"])] = (float(r["loss"]), r.get("loss_steps"))
        prev, windows = 0, {}
        for step in sorted(out):
            loss, n = out[step]
            windows[step] = (loss, int(n) if isinstance(n, int) else step - prev)
            prev = step
        return windows


def _script_of(run: RunDir) -> str | None:
    """The script a ``dtrain run`` ran (its plan's ``script``), None for dtrain's trainer."""
    import yaml

    try:
        script = (yaml.safe_load(run.plan.read_text()) or {}).get("script") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return script.get("path") or script.get("module") if isinstance(script, dict) else None


def load_run(path: Path) -> RunData:
    """A folder ``dtrain launch`` made (plan.yaml + metrics.jsonl); RunDirError otherwise."""
    if path.is_file():  # a run's metrics.jsonl or summary.json, say: its folder is meant
        raise RunDirError(f"{path}: a file; give its run dir ({path.parent})")
    if not path.is_dir():
        raise RunDirError(f"{path}: no such folder; give a run dir such as runs/<run>")
    run = RunDir(path)
    if not run.plan.is_file():
        raise RunDirError(
            f"{path}: not a run dir (no {run.plan.name}); give a folder `dtrain launch` "
            "made, such as runs/<run>"
        )
    metrics = run.metrics
    if not metrics.is_file():
        if script := _script_of(run):
            raise RunDirError(
                f"{path}: a run of your own script ({script}), whose steps dtrain does not "
                f"see; its ranks' output is in {run.logs.name}/rank_<k>.log"
            )
        raise RunDirError(f"{path}: no metrics.jsonl yet (the run logged no step)")
    records = []
    for n, line in enumerate(metrics.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise RunDirError(f"{metrics}:{n}: not a JSON line") from None
        # a value not measured is null (a NaN loss, say): NaN again, so a diverged run
        # still compares as diverged
        records.append({k: math.nan if v is None else v for k, v in record.items()})
    if not any(r.get("kind") == "train" for r in records):
        raise RunDirError(f"{metrics}: no training step logged")
    summary: dict[str, Any] = {}
    if run.summary.is_file():
        try:
            summary = json.loads(run.summary.read_text())
        except ValueError:
            summary = {}
    return RunData(path, records, summary)


def rel_diff(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|); inf when exactly one is not finite, 0 when both equal."""
    if math.isnan(a) and math.isnan(b):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


@dataclass
class Comparison:
    steps: list[int]
    losses: list[list[float]]  # per step, one per run
    max_rel: float
    max_rel_step: int
    first_divergent: int | None
    merged: bool = False  # windows of finer-logged runs merged into the common ones


def merge_windows(windows: dict[int, tuple[float, int]], ends: list[int]) -> list[float]:
    """The mean loss over each window (previous end, end] of ``ends``, from a run's logged
    window means weighted by their step counts (exact: a mean of means by weight)."""
    out, i = [], 0
    steps = sorted(windows)
    for end in ends:
        total = count = 0.0
        while i < len(steps) and steps[i] <= end:
            loss, n = windows[steps[i]]
            if n:
                total, count = total + loss * n, count + n
            i += 1
        out.append(total / count if count else math.nan)
    return out


def _no_common_steps(runs: list[RunData], per_run: list[dict[int, Any]]) -> str:
    """Why no logged window ends at a step every run logged: a run that stopped (or has
    logged nothing yet) before another's first logged step, else logging.every values
    that do not divide each other."""
    names = ", ".join(str(r.path) for r in runs)
    firsts = [min(p) if p else None for p in per_run]
    for run, steps in zip(runs, per_run, strict=True):
        others = [
            (f, r) for f, r in zip(firsts, runs, strict=True) if f is not None and r is not run
        ]
        if not others:
            continue
        first, other = min(others, key=lambda fr: fr[0])
        if not steps or max(steps) < first:
            logged = f"logged only up to step {max(steps)}" if steps else "logged no loss"
            return (
                f"no common logged steps in {names}: {run.path} {logged}; {other.path}'s first "
                f"logged step is {first}"
            )
    return (
        f"no common logged steps in {names}: each logged loss is the mean over the "
        "steps since the one logged before, so windows must end at the same steps; "
        "compare runs whose logging.every divide each other"
    )


def compare_runs(runs: list[RunData], tol: float) -> Comparison:
    """Train losses at the steps every run logged, each the mean over the same window (a
    run logged more often has its windows merged into the common ones); the first step
    whose largest relative difference from the first run is above ``tol``."""
    per_run = [r.loss_windows() for r in runs]
    common = sorted(set.intersection(*(set(p) for p in per_run)))
    if not common:
        raise RunDirError(_no_common_steps(runs, per_run))
    merged = any(sorted(s for s in p if s <= common[-1]) != common for p in per_run)
    columns = [merge_windows(p, common) for p in per_run]
    rows = [list(row) for row in zip(*columns, strict=True)]
    diffs = [max(rel_diff(row[0], v) for v in row[1:]) for row in rows]
    worst = max(range(len(diffs)), key=lambda i: diffs[i])
    first = next((s for s, d in zip(common, diffs, strict=True) if d > tol), None)
    return Comparison(common, rows, diffs[worst], common[worst], first, merged)


def summary_text(run: RunData) -> str:
    """The few numbers a person reads, plus what went wrong (stragglers, numerics)."""
    s = run.summary
    steps, losses = run.series("loss")
    _, val = run.series("val_loss", "val")
    lines = [f"run: {run.path}"]
    lines.append(f"steps logged: {len(steps)} (last step {steps[-1]})")
    lines.append(f"final loss: {losses[-1]:.4f}" + (f"   val loss: {val[-1]:.4f}" if val else ""))
    for key, label, fmt in (
        ("tokens_per_s", "tokens/s (median)", ",.0f"),
        ("samples_per_s", "samples/s (median)", ",.0f"),
        ("mfu", "MFU (measured, of the hardware profile's peak)", ".1%"),
        ("train_wall_s", "train wall time, s", ",.1f"),
        ("data_wait_ms_per_step", "data wait, ms/step", ".2f"),
    ):
        if key == "train_wall_s" and s.get("resumed_from"):  # the last segment's
            label += f" (since the resume from {s['resumed_from']})"
        if isinstance(s.get(key), (int, float)):
            lines.append(f"{label}: {format(s[key], fmt)}")
    for key in ("rank_step_ms_median", "rank_compute_ms_median", "rank_data_ms_median"):
        if key in s:
            lines.append(f"{key}: {s[key]}")
    if s.get("stragglers"):
        lines.append(f"stragglers (rank: logging steps named): {s['stragglers']}")
    numerics = s.get("numerics") or {}
    acted = {k: v for k, v in numerics.items() if k != "events" and v}
    if acted:
        lines.append(f"numerics: {acted}")
    if not s:
        lines.append("no summary.json: the run did not finish")
    return "\n".join(lines) + "\n"
