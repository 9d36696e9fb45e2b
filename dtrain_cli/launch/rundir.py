"""The run directory: ``runs/<recipe>-<timestamp>/`` with the resolved config and plan.

runs/gpt_small-20261129-101500/
  config.yaml  plan.yaml  metrics.jsonl  summary.json
  logs/rank_<k>.log  tb/  checkpoints/
"""

from __future__ import annotations

import time
from pathlib import Path

from dtrain_cli.config.compose import config_to_yaml
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan


def new_run_dir(cfg: DtrainConfig) -> Path:
    root = Path(cfg.run.root)
    name = cfg.run.name or f"{cfg.run.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = root / name
    suffix = 1
    while path.exists() and cfg.run.name is None:
        path = root / f"{name}-{suffix}"
        suffix += 1
    return path


def materialize(cfg: DtrainConfig, plan: Plan, path: Path | None = None) -> Path:
    """Create the run dir and write config.yaml + plan.yaml; returns the absolute path."""
    path = (path or new_run_dir(cfg)).resolve()
    if (path / "plan.yaml").exists():
        raise FileExistsError(f"{path} already holds a run; choose another run.name")
    (path / "logs").mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(config_to_yaml(cfg))
    plan.save(path / "plan.yaml")
    return path
