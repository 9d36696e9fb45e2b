"""``dtrain checkpoints runs/<run>``: the checkpoints of a run, newest last.

    dtrain checkpoints runs/<run> --verify     # sha256 of every file; exit 1 when one is bad

Exit code 0 when every listed checkpoint verifies (size checks; with ``--verify`` also the
sha256 of every file, and a line saying so), 1 when one does not (a ``step_*`` folder given:
that checkpoint only): each problem is printed below the table, one
line with the whole path, and ``latest`` pointing at a bad checkpoint says which one a
resume would use instead.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from dtrain_cli.cli.common import err_console, fail, print_whole


def checkpoints(
    run_dir: Path = typer.Argument(
        ..., help="A run directory (or its checkpoints/ or a checkpoints/step_* folder)."
    ),
    verify: bool = typer.Option(False, "--verify", help="Also check every file's sha256."),
) -> None:
    """Table of checkpoints: step, time, size, complete?, loss. Exit 1 if one is bad.

    Guide: docs/checkpoints.md
    """
    from dtrain_cli.checkpoint import catalog

    asked = run_dir
    run_dir = _run_dir_of(run_dir)
    infos = catalog.list_checkpoints(run_dir)
    one = catalog.STEP_DIR.match(asked.name) is not None
    if one:  # one checkpoint asked about: that one, not the run's latest
        infos = [i for i in infos if i.path.name == asked.name]
    if not infos:
        fail([f"{run_dir}: no checkpoints in {catalog.checkpoints_dir(run_dir)}"], code=1)
    latest_file = catalog.checkpoints_dir(run_dir) / catalog.LATEST
    latest = latest_file.read_text().strip() if latest_file.exists() else ""
    complete = [i.path.name for i in catalog.list_checkpoints(run_dir) if i.complete]
    if latest in complete and latest != complete[-1]:  # a save's crash between its rename
        latest = complete[-1]  # and its latest: the one a resume takes, the newest
    table = Table(title=f"checkpoints of {run_dir}")
    for col in ("step", "saved", "size", "complete", "loss", "val loss", "world", ""):
        table.add_column(col)
    problems: dict[str, str] = {}
    for info in infos:
        status = "yes" if info.complete else "no"
        try:
            catalog.verify(info.path, deep=verify)
        except catalog.CheckpointError as exc:
            problems[info.path.name] = str(exc)
            status = "[red]no[/] (see below)" if info.complete else "[red]no[/]"
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
    print_whole(table)
    lines = list(problems.values())  # each names the whole path of the bad file
    if not one and latest and (latest in problems or not (latest_file.parent / latest).is_dir()):
        good = [i.path.name for i in reversed(infos) if i.path.name not in problems]
        why = "is bad" if latest in problems else "does not exist"
        instead = f"a resume uses {good[0]} instead" if good else "no checkpoint verifies"
        lines.append(f"latest -> {latest} {why}; {instead}")
    for line in lines:
        err_console.print(
            f"[bold red]error:[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True
        )
    if lines:
        raise typer.Exit(1)
    if verify:  # the table reads the same either way: say what was checked
        n = len(infos)
        typer.echo(f"verified: every file of the {n} checkpoint{'s' * (n > 1)} matches the "
                   "sha256 in its manifest")  # fmt: skip


def _run_dir_of(path: Path) -> Path:
    """The run dir of ``path``: itself, or the one above its checkpoints/ or a
    checkpoints/step_* folder (what ``dtrain resume --ckpt`` takes); exit 2 otherwise."""
    from dtrain_cli.checkpoint import catalog

    if not path.is_dir():
        fail([f"{path}: no such run directory"])
    run_dir = catalog.run_dir_of(path)
    if run_dir is None:
        fail([f"{path}: not a run dir (no plan.yaml); give a folder `dtrain launch` made"])
    return run_dir
