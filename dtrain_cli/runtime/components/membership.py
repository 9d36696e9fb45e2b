"""Membership changes of an elastic run (``parallel.nnodes=MIN:MAX``), as rank 0 sees them.

    dtrain launch recipe=gpt_tiny parallel.nnodes=1:2 dp=2 launcher.max_restarts=4 \\
        --node-rank 0 --rdzv-endpoint host0:29500 --rdzv-id exp1      # and on the other node

Rank 0 of every group notes its size and last finished step in ``elastic/progress.json``
after each step (one small file, no collective). A group that starts at another size than
the one before it (a node was lost, or one joined) records the change in
``elastic/changes.jsonl`` at its first step: time, old and new size (processes and nodes),
the steps redone (the old group's last step minus the checkpoint step resumed from) and how
long the change took (old group's last step to the new group's first). ``summary.json``
lists them all (``membership_changes``), the sizes the run trained at (``memberships``:
world size, nodes, first and last step of each) and the whole run's wall time
(``train_wall_s``, since the first group started; the last group's alone is
``train_wall_s_last_membership``). A ``dtrain resume`` starts that count again. Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir

log = logging.getLogger("dtrain")


class Membership:
    def __init__(self, run_dir: Path, plan: Plan, rank: int, resumed_step: int) -> None:
        self.enabled = plan.elastic is not None and rank == 0
        run = RunDir(run_dir)
        self.folder, self.progress_file, self.changes_file = (
            run.elastic,
            run.elastic_progress,
            run.elastic_changes,
        )
        self.world_size, self.nnodes = plan.world_size, plan.nnodes
        self.pending: dict[str, Any] | None = None
        self.started = time.time()
        self.history: list[list[Any]] = []  # [world size, nodes, first step, last step]
        if not self.enabled:
            return
        self.folder.mkdir(exist_ok=True)
        before = self._read(self.progress_file)
        if before and not self._resumed_since(run, float(before["time"])):
            self.started = float(before.get("started", self.started))
            self.history = list(before.get("history") or [])
        if not self.history or self.history[-1][0] != self.world_size:
            self.history.append([self.world_size, self.nnodes, resumed_step + 1, resumed_step])
        if before and before.get("world_size") != self.world_size:
            self.pending = {
                "old_world_size": before["world_size"],
                "new_world_size": self.world_size,
                "old_nnodes": before.get("nnodes"),
                "new_nnodes": self.nnodes,
                "old_last_step": before["step"],
                "resumed_step": resumed_step,
                "steps_redone": max(0, int(before["step"]) - resumed_step),
                "old_last_step_time": before["time"],
            }

    def step_done(self, step: int) -> None:
        """After each optimizer step (rank 0 of an elastic run; a no-op otherwise)."""
        if not self.enabled:
            return
        now = time.time()
        if self.pending is not None:
            change = {**self.pending, "time": now}
            change["took_s"] = round(now - float(change.pop("old_last_step_time")), 3)
            with open(self.changes_file, "a") as f:
                f.write(json.dumps(change) + "\n")
            log.info(
                "membership change: %d -> %d processes (%s -> %s nodes); %d step(s) redone "
                "(resumed at step %d); the change took %.1f s",
                change["old_world_size"],
                change["new_world_size"],
                change["old_nnodes"],
                change["new_nnodes"],
                change["steps_redone"],
                change["resumed_step"],
                change["took_s"],
            )
            self.pending = None
        self.history[-1][3] = step
        tmp = self.folder / f".progress.{os.getpid()}.tmp"
        tmp.write_text(
            json.dumps(
                {
                    "world_size": self.world_size,
                    "nnodes": self.nnodes,
                    "step": step,
                    "time": now,
                    "started": self.started,
                    "history": self.history,
                }
            )
        )
        tmp.replace(self.progress_file)

    def summary(self, wall_s: float) -> dict[str, Any]:
        """The whole run's wall time and the sizes it ran at (``wall_s``: this group's)."""
        if not self.enabled:
            return {}
        return {
            "train_wall_s": time.time() - self.started,
            "train_wall_s_last_membership": wall_s,
            "memberships": [
                {"world_size": w, "nnodes": n, "first_step": a, "last_step": b}
                for w, n, a, b in self.history
            ],
        }

    @staticmethod
    def _resumed_since(run: RunDir, last_step_time: float) -> bool:
        """A ``dtrain resume`` after the last recorded step: a new run's wall clock."""
        try:
            lines = run.resumes.read_text().splitlines()
            return bool(lines) and float(json.loads(lines[-1])["time"]) > last_step_time
        except (OSError, ValueError, KeyError):
            return False

    def changes(self) -> list[dict[str, Any]]:
        path = self.changes_file
        if not self.enabled or not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
