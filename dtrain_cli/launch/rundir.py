"""A new run directory: ``runs/<recipe>-<timestamp>/`` with the resolved config and plan.

    dtrain launch recipe=gpt_small      # -> runs/gpt_small-20261201-101500/config.yaml, plan.yaml

What the directory holds is :mod:`dtrain_cli.rundir` (:class:`RunDir`); the launcher makes
one here and the workers read it.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from dtrain_cli.config.compose import config_to_yaml
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir


def new_run_dir(cfg: DtrainConfig) -> Path:
    """``run.root/run.name``, or ``<recipe>-<timestamp>`` (``-1``, ``-2`` ... if taken); a
    run without a recipe is named after its model (:func:`.plan.naming.run_label`)."""
    root = Path(cfg.run.root)
    from dtrain_cli.plan.naming import run_label

    name = cfg.run.name or f"{run_label(cfg)}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = root / name
    suffix = 1
    while path.exists() and cfg.run.name is None:
        path = root / f"{name}-{suffix}"
        suffix += 1
    return path


RELATIVE_PATHS = (
    ("data", "path"),
    ("data", "val_path"),
    ("data", "tokenizer"),
    ("model", "pretrained"),
)
"""The files a run reads that a user names relative to where they start it."""


def run_config_text(cfg: DtrainConfig) -> str:
    """``config.yaml`` of a one-node run: the config with each of :data:`RELATIVE_PATHS`
    that names a file here made absolute, so a ``dtrain resume`` from another folder reads
    the same files (it read ``train.jsonl`` of the folder it was started in, or failed: a new
    user's find). Not a multi-node run's: each node compares its own config text with it,
    and a relative path is each node's own (:func:`.multinode.join_run_dir`)."""
    for section, key in RELATIVE_PATHS:
        part = getattr(cfg, section)
        given = getattr(part, key, None)
        relative = isinstance(given, str) and given and not given.startswith(("/", "~"))
        if relative and Path(given).exists():
            cfg = replace(cfg, **{section: replace(part, **{key: os.path.abspath(given)})})
    return config_to_yaml(cfg)


def materialize(cfg: DtrainConfig, plan: Plan, path: Path | None = None) -> Path:
    """Create the run dir and write config.yaml + plan.yaml; returns the absolute path."""
    run = RunDir((path or new_run_dir(cfg)).resolve())
    if run.plan.exists():
        raise FileExistsError(taken(run))
    run.logs.mkdir(parents=True, exist_ok=True)
    run.config.write_text(run_config_text(cfg))
    plan.save(run.plan)
    return run.path


def taken(run: RunDir) -> str:
    """A run dir that holds a run already: another name, or how that run continues (a
    script's run that finished does not: its resume is refused)."""
    if run.finished.exists():
        return (
            f"{run.path} already holds a run, which finished; choose another run.name (or "
            "--rdzv-id)"
        )
    job = run.slurm / "job.sbatch"  # a dtrain sbatch job's: it resumes on its cluster
    how = f"sbatch {job}" if job.is_file() else f"dtrain resume {run.path}"
    return (
        f"{run.path} already holds a run; choose another run.name (or --rdzv-id), or continue "
        f"that one: {how}"
    )
