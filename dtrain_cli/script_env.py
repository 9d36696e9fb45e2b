"""Read dtrain's resolved config and plan from your own script (``dtrain run train.py``).

    from dtrain_cli import script_env

    run = script_env.current()          # None when not started by dtrain run: use defaults
    if run is not None:
        batch = run.micro_batch_size     # per rank, per forward/backward
        accum = run.grad_accum           # micro-steps per optimizer step
        lr = run.lr_at(step)             # scaled, warmed up and decayed as the plan says
        if run.should_checkpoint(step): ...
        run.coords                       # this rank's mesh coordinates: {"pp": 0, "dp": 1, "tp": 0}
        run.config["optim"]["base_lr"]   # the whole resolved config (plain dicts)

Torch-free and optional: a script that ignores it runs the same. It reads the two files
``dtrain run`` names in the environment, ``DTRAIN_RUN_DIR`` (the run directory: logs,
plan.yaml, config.yaml; a good place for your checkpoints) and ``DTRAIN_PLAN``.

Preemption (SLURM's ``--signal``, ``kill -USR1 <dtrain pid>``): dtrain passes the signal
(``cluster.signal``, default USR1) to every rank. Catch it, save your checkpoint, and exit
with :data:`EXIT_PREEMPTED` (75), e.g. ``raise SystemExit(script_env.EXIT_PREEMPTED)``:
dtrain records ``preempted.json``, the launcher exits 75, and a ``dtrain sbatch`` job
requeues itself and runs the script again (resume from your checkpoint). Any other code is
a failure (with ``launcher.max_restarts`` the group restarts; otherwise the launcher exits
with it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import EXIT_PREEMPTED, SIGNAL_NAMES

__all__ = ["EXIT_PREEMPTED", "SIGNAL_NAMES", "ScriptRun", "current"]


@dataclass
class ScriptRun:
    """The run this rank belongs to."""

    run_dir: Path
    plan: Plan
    config: dict[str, Any]
    rank: int

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def global_batch_size(self) -> int:
        return self.plan.batch.global_batch_size

    @property
    def micro_batch_size(self) -> int:
        return self.plan.batch.micro_batch_size

    @property
    def grad_accum(self) -> int:
        return self.plan.batch.grad_accum

    @property
    def steps(self) -> int:
        return self.plan.steps

    @property
    def coords(self) -> dict[str, int]:
        """This rank's (pp, dp, tp) coordinates, as ``init_device_mesh`` lays them out."""
        return self.plan.mesh.coords(self.rank)

    @property
    def checkpoint_dir(self) -> Path:
        return RunDir(self.run_dir).checkpoints

    @property
    def preemption_signal(self) -> str:
        return str(self.config.get("cluster", {}).get("signal") or "USR1")

    def lr_at(self, step: int) -> float:
        """The LR for optimizer step ``step`` (0-based): base_lr scaled to the global batch
        (optim.lr_scaling), linear warmup, then the planned decay."""
        return self.plan.lr.lr_at(step)

    def should_checkpoint(self, step: int) -> bool:
        """``checkpoint.every_steps`` and the end of training (``checkpoint.at_end``);
        ``step`` counts finished optimizer steps (1-based)."""
        ck = self.plan.checkpoint
        return step in ck.steps or bool(ck.every_steps and step % ck.every_steps == 0)


def current() -> ScriptRun | None:
    """The run, when this process was started by ``dtrain run``; else None."""
    path = env.run_dir()
    if path is None:
        return None
    run = RunDir(path)
    plan = Plan.load(env.plan_file() or run.plan)
    config = yaml.safe_load(run.config.read_text()) if run.config.is_file() else {}
    return ScriptRun(path, plan, config or {}, int(os.environ.get("RANK", "0")))
