"""``dtrain export --ckpt runs/<run>/checkpoints/step_N --out model.safetensors``."""

from __future__ import annotations

from pathlib import Path

import typer

from dtrain_cli.cli.common import CKPT_HELP, console, err_console, fail


def export(
    ckpt: Path = typer.Option(..., "--ckpt", help=CKPT_HELP),
    out: Path = typer.Option(..., "--out", help="The .safetensors file to write."),
) -> None:
    """Write one consolidated safetensors file (+ a JSON model config) for plain PyTorch."""
    from dtrain_cli.checkpoint import catalog

    def warn(msg: str) -> None:
        err_console.print(f"[yellow]warning:[/] {msg}", highlight=False)

    try:
        _, path = catalog.resolve(ckpt, warn)
    except catalog.CheckpointError as exc:
        fail([str(exc)])
    if not out.parent.is_dir():
        fail([f"--out {out}: folder {out.parent} does not exist"])
    from dtrain_cli.checkpoint.export import export_safetensors

    try:
        weights, config = export_safetensors(path, out)
    except (OSError, catalog.CheckpointError) as exc:
        msg = getattr(exc, "strerror", None) or str(exc)
        fail([f"--out {out}: cannot write ({msg})"], code=1)
    console.print(f"exported {path.name} -> {weights} (+ {config.name})", highlight=False)
