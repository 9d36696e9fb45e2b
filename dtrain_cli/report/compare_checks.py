"""What ``dtrain compare`` says beside the train losses: a run that did not finish, a
validation loss that differs, settings that differ beyond the layout. Torch-free.

    dtrain compare runs/a runs/b      # exit 1 also when a run stopped early or val differs

Before, a run that died at step 2 of 4 compared as "no step diverges" (exit 0) on its one
common step, val loss was not compared, and runs of other steps, seeds or precisions were
compared as if only their layout differed (a new user's finds).
"""

from __future__ import annotations

from typing import Any

import yaml

from dtrain_cli.report.runs import RunData, rel_diff
from dtrain_cli.rundir.config_keys import flat_keys
from dtrain_cli.rundir.layout import RunDir

LAYOUT_PREFIXES = (
    "parallel.",
    "pipeline.",
    "run.",
    "launcher.",
    "logging.",
    "debug.",
    "checkpoint.",
    "comm.",
    "cluster.",
    "hardware.",
    "data.num_workers",
    "data.prefetch_factor",
    "data.cache_dir",
    "train.micro_batch_size",
    "train.grad_accum",
)
"""Keys a layout comparison expects to differ (how it runs, not what it trains)."""


def unfinished(runs: list[RunData]) -> list[str]:
    """Runs without summary.json: stopped (failed, killed, still running) at their last step."""
    out = []
    for r in runs:
        if not r.summary:
            steps, _ = r.series("loss")
            out.append(
                f"{r.path}: no summary.json: it did not finish (last logged step {max(steps)}); "
                "its losses are compared as far as they go"
            )
    return out


def val_divergence(runs: list[RunData], tol: float) -> tuple[str | None, bool]:
    """(a line on the validation losses at the steps every run validated, whether one
    differs by more than ``tol``); (None, False) when they have no step in common."""
    per_run = [dict(zip(*r.series("val_loss", kind="val"), strict=True)) for r in runs]
    common = sorted(set.intersection(*(set(p) for p in per_run)))
    if not common:
        return None, False
    diffs = {s: max(rel_diff(per_run[0][s], p[s]) for p in per_run[1:]) for s in common}
    step = max(diffs, key=lambda s: diffs[s])
    bad = diffs[step] > tol
    said = (
        f"val loss at {len(common)} common step(s): max rel diff {diffs[step]:.3e} at step {step}"
    )
    return said + (f" (> {tol:g})" if bad else ""), bad


def setting_differences(runs: list[RunData], shown: int = 6) -> str | None:
    """The config keys beyond the layout whose values differ between the runs."""
    configs = [_config(r) for r in runs]
    if any(c is None for c in configs):
        return None
    flats = [flat_keys(c) for c in configs]
    keys = sorted(set().union(*flats))  # type: ignore[arg-type]
    differ = [
        k
        for k in keys
        if not k.startswith(LAYOUT_PREFIXES) and len({repr(f.get(k)) for f in flats}) > 1  # type: ignore[union-attr]
    ]
    if not differ:
        return None
    parts = [f"{k} {' | '.join(str(f.get(k)) for f in flats)}" for k in differ[:shown]]  # type: ignore[union-attr]
    more = f" (+{len(differ) - shown} more)" if len(differ) > shown else ""
    return "the runs differ beyond the layout: " + "; ".join(parts) + more


def _config(run: RunData) -> Any:
    try:
        return yaml.safe_load(RunDir(run.path).config.read_text())
    except (OSError, yaml.YAMLError):
        return None
