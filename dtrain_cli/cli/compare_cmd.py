"""``dtrain compare RUN_A RUN_B [...]``: the layout-invariance check as one command.

    dtrain compare runs/<dp2-run> runs/<pp2-run>            # per-step table, max rel diff
    dtrain compare runs/a runs/b --tol 1e-5 --out cmp.png   # first divergent step, plot

A logged loss is the mean over the steps since the previous logged step, so runs logged at
different ``logging.every`` are compared on the windows they all closed (the finer run's
windows merged, weighted by their steps). Exit 0 when every common step agrees within
``--tol``; 1 when some step (or a common validation step) diverges, or a run did not
finish (:mod:`dtrain_cli.report.compare_checks`, which also names settings that differ
beyond the layout); 2 on bad input (not a run dir, no common steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

if TYPE_CHECKING:
    from dtrain_cli.report.runs import Comparison

from dtrain_cli.cli.common import console, err_console, fail, print_whole

HEAD_WIDTH = 24  # a run's name as a column head; longer or alike names get a letter


def column_heads(names: list[str]) -> tuple[list[str], list[str]]:
    """(column heads, legend lines): the run names when they are short and distinct
    whole, else A, B, ... with a legend naming each run in full."""
    if len(set(names)) == len(names) and all(len(n) <= HEAD_WIDTH for n in names):
        return names, []
    letters = [chr(ord("A") + i) if i < 26 else f"R{i}" for i in range(len(names))]
    return letters, [f"{h} = {n}" for h, n in zip(letters, names, strict=True)]


def speed_lines(data: list, heads: list[str]) -> list[str]:
    """Each run's steady tokens/s (or samples/s) from its summary, against the first run's:
    the comparison of speed beside the one of losses."""
    rates = []
    for d in data:
        unit = "samples/s" if "samples_per_s" in d.summary else "tokens/s"
        rate = d.summary.get("samples_per_s" if unit == "samples/s" else "tokens_per_s")
        rates.append((rate, unit) if isinstance(rate, (int, float)) and rate > 0 else None)
    if rates[0] is None or not any(r is not None for r in rates[1:]):
        return []
    first, unit = rates[0]
    parts = [
        f"{h} {r[0]:,.0f} {r[1]}"
        + ("" if i == 0 or r[1] != unit else f" ({r[0] / first:.2f}x {heads[0]})")
        for i, (h, r) in enumerate(zip(heads, rates, strict=True))
        if r is not None
    ]
    return ["speed (steady median, summary.json): " + ", ".join(parts)]


def loss_table(result: Comparison, heads: list[str], tol: float, rows: int) -> Table:
    """The losses step by step, ``rows`` of them around the first divergent step."""
    from dtrain_cli.report.runs import rel_diff

    table = Table(show_header=True, header_style="bold")
    table.add_column("step", justify="right", no_wrap=True)
    for head in heads:
        table.add_column(head, justify="right", no_wrap=True)
    table.add_column("max rel diff", justify="right", no_wrap=True)
    start = 0
    if result.first_divergent is not None:
        start = max(0, result.steps.index(result.first_divergent) - rows // 2)
    for step, row in list(zip(result.steps, result.losses, strict=True))[start : start + rows]:
        diff = max(rel_diff(row[0], v) for v in row[1:])
        mark = "[red]" if diff > tol else ""
        table.add_row(str(step), *(f"{v:.6f}" for v in row), f"{mark}{diff:.2e}")
    return table


def compare(
    runs: list[Path] = typer.Argument(..., help="Two or more run directories."),
    tol: float = typer.Option(1e-4, "--tol", help="Relative difference that counts as diverged."),
    out: Path = typer.Option(
        Path("compare.png"), "--out", help="The overlaid loss plot (default ./compare.png)."
    ),
    rows: int = typer.Option(20, "--rows", help="Table rows shown around the first divergence."),
) -> None:
    """Train losses of runs step by step: max relative difference, first divergent step.

    Guide: docs/debugging.md
    """
    from dtrain_cli.report.runs import RunDirError, compare_runs, load_run

    if len(runs) < 2:
        fail(["dtrain compare needs two or more run dirs"])
    if tol < 0:
        fail([f"--tol={tol}: must be >= 0"])
    try:
        data = [load_run(p) for p in runs]
        result = compare_runs(data, tol)
    except RunDirError as exc:
        fail([str(exc)])
    heads, legend = column_heads([str(p) for p in runs])
    sizes = {d.summary.get("params") for d in data} - {None}
    if len(sizes) > 1:  # a comparison of models, not of settings
        err_console.print(
            "warning: the runs train models of different sizes ("
            + ", ".join(f"{n:,}" for n in sorted(sizes))
            + " parameters): their losses differ by model, not only by setting",
            highlight=False,
            soft_wrap=True,
        )
    for line in legend:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    print_whole(loss_table(result, heads, tol, rows))
    if result.merged:
        console.print(
            "logged at different steps: each loss above is the mean over the steps since "
            "the previous row (the windows every run closed)",
            highlight=False,
            soft_wrap=True,
        )
    from dtrain_cli.report.plots import compare_plot

    path = compare_plot(data, result, out)  # its legend names every run in full
    console.print(
        f"{len(result.steps)} common steps; max rel diff {result.max_rel:.3e} at step "
        f"{result.max_rel_step}; "
        + (
            f"first divergent step {result.first_divergent} (> {tol:g})"
            if result.first_divergent is not None
            else f"no step diverges (<= {tol:g})"
        ),
        highlight=False,
        soft_wrap=True,
    )
    from dtrain_cli.report.compare_checks import setting_differences, unfinished, val_divergence

    val_line, val_differs = val_divergence(data, tol)
    if val_line:
        console.print(val_line, highlight=False, soft_wrap=True)
    for line in speed_lines(data, heads):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"plot: {path}", highlight=False, soft_wrap=True)
    stopped = unfinished(data)
    differs = setting_differences(data)
    for line in [*stopped, *([differs] if differs else [])]:
        err_console.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)
    if result.first_divergent is not None or val_differs or stopped:
        raise typer.Exit(1)
