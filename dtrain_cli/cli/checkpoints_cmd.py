"""``dtrain checkpoints runs/<run>``: the checkpoints of a run, newest last."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from dtrain_cli.cli.common import console, fail


def checkpoints(
    run_dir: Path = typer.Argument(..., help="A run directory."),
    verify: bool = typer.Option(False, "--verify", help="Also check every file's sha256."),
) -> None:
    """Table of checkpoints: step, time, size, complete?, loss."""
    from dtrain_cli.checkpoint import catalog

    if not run_dir.is_dir():
        fail([f"{run_dir}: no such run directory"])
    infos = catalog.list_checkpoints(run_dir)
    if not infos:
        fail([f"{run_dir}: no checkpoints in {catalog.checkpoints_dir(run_dir)}"], code=1)
    latest_file = catalog.checkpoints_dir(run_dir) / catalog.LATEST
    latest = latest_file.read_text().strip() if latest_file.exists() else ""
    table = Table(title=f"checkpoints of {run_dir}")
    for col in ("step", "saved", "size", "complete", "loss", "val loss", "world", ""):
        table.add_column(col)
    for info in infos:
        status = "yes" if info.complete else "no"
        try:
            catalog.verify(info.path, deep=verify)
        except catalog.CheckpointError as exc:
            status = f"[red]no[/]: {exc}"
        meta = info.meta
        saved = meta.get("saved_at")
        table.add_row(
            str(info.step),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved)) if saved else "-",
            f"{info.size_bytes / 2**20:,.1f} MiB",
            status,
            f"{meta['loss']:.4f}" if isinstance(meta.get("loss"), float) else "-",
            f"{meta['val_loss']:.4f}" if isinstance(meta.get("val_loss"), float) else "-",
            str(meta.get("world_size", "-")),
            "latest" if info.path.name == latest else "",
        )
    console.print(table)
