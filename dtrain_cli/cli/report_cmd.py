"""``dtrain report RUN``: PNG plots and a short text summary of a run, in ``RUN/report/``.

dtrain report runs/<run>              # loss.png lr.png tokens_per_s.png
dtrain report runs/<run> --out plots  # step_breakdown.png ranks.png summary.txt
"""

from __future__ import annotations

from pathlib import Path

import typer

from dtrain_cli.cli.common import console, fail
from dtrain_cli.rundir.layout import RunDir


def report(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/<run>)."),
    out: Path | None = typer.Option(None, "--out", help="Folder for the PNGs (RUN/report/)."),
) -> None:
    """Plot a run: loss and val loss, LR, tokens/s, step-time breakdown, per-rank times.

    Guide: docs/debugging.md
    """
    from dtrain_cli.report.runs import RunDirError, load_run, summary_text

    try:
        run = load_run(run_dir)
    except RunDirError as exc:
        fail([str(exc)])
    from dtrain_cli.report.plots import report_plots

    folder = out or RunDir(run_dir).report
    try:
        paths = report_plots(run, folder)
    except OSError as exc:
        fail([f"--out {folder}: cannot write the plots ({exc.strerror or exc})"])
    text = summary_text(run)
    (folder / "summary.txt").write_text(text)
    console.print(text, highlight=False, markup=False, end="", soft_wrap=True)
    console.print(
        f"plots: {' '.join(p.name for p in paths)} summary.txt in {folder}", highlight=False
    )
