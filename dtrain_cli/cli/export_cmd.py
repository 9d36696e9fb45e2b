"""``dtrain export --ckpt runs/<run>/checkpoints/step_N --out model.safetensors`` (or
``--format hf --out DIR`` for Hugging Face models)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from dtrain_cli.cli.common import CKPT_HELP, checkpoint_arg, console, fail, print_warnings
from dtrain_cli.config.suggest import not_allowed


def export(
    run: Path = typer.Argument(None, help=CKPT_HELP + " The same as --ckpt.", show_default=False),
    ckpt: Path = typer.Option(None, "--ckpt", help=CKPT_HELP),
    out_text: str = typer.Option(
        ...,
        "--out",
        help="The .safetensors file to write, or a folder to hold model.safetensors "
        "(the folder to fill with --format hf).",
    ),
    fmt: str = typer.Option(
        "safetensors", "--format", help="safetensors (any model) | hf (save_pretrained folder)."
    ),
) -> None:
    """Write the trained model for use outside dtrain: one safetensors file (+ a JSON model
    config), or a Hugging Face folder that from_pretrained loads.

    Guide: docs/checkpoints.md
    """
    if run is not None and ckpt is not None:
        fail([f"{run} and --ckpt {ckpt}: name the checkpoint once"])
    from dtrain_cli.checkpoint.export import FORMATS

    if fmt not in FORMATS:
        fail([not_allowed("--format", fmt, FORMATS)])
    out = safetensors_path(out_text) if fmt == "safetensors" else Path(out_text)
    folder = out.parent.parent if out.parent == Path(out_text) else out.parent  # DIR/: made
    if not folder.is_dir():
        fail([f"--out {out_text}: folder {folder} does not exist"])
    ckpt, _ = checkpoint_arg(ckpt, [str(run)] if run is not None else [], "export")
    from dtrain_cli.checkpoint import catalog

    def warn(msg: str) -> None:  # whole lines: a path in it stays one to copy
        print_warnings([msg])

    try:
        _, path = catalog.resolve(ckpt, warn)
    except catalog.CheckpointError as exc:
        fail([str(exc)])
    from dtrain_cli.checkpoint.export import export_model

    try:
        files = export_model(path, out, fmt)
    except ValueError as exc:  # the model kind cannot export in this format
        fail([str(exc)])
    except (OSError, catalog.CheckpointError) as exc:
        msg = getattr(exc, "strerror", None) or str(exc)
        fail([f"--out {out}: cannot write ({msg})"], code=1)
    shown = " + ".join(f.name for f in files[1:])
    console.print(
        f"exported {path.name} -> {files[0]}" + (f" (+ {shown})" if shown else ""),
        highlight=False,
    )


def safetensors_path(text: str) -> Path:
    """The file a safetensors export writes: ``--out`` itself, or ``model.safetensors`` in
    a folder (one that exists, or a name ending in /: it was 'cannot write (Is a
    directory)'); another suffix is bad input (``--out model.pt`` wrote safetensors bytes
    that ``torch.load`` cannot read)."""
    out = Path(text)
    if out.is_dir() or text.endswith(("/", os.sep)):
        return out / "model.safetensors"
    if out.suffix != ".safetensors":
        fail(
            [
                f"--out {out}: the safetensors format writes one .safetensors file; name it "
                f"{out.with_suffix('.safetensors')}, give a folder (DIR/), or use --format hf"
            ]
        )
    return out
