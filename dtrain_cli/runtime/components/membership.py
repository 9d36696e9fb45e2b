"""Membership changes of an elastic run (``parallel.nnodes=MIN:MAX``), as rank 0 sees them.

    dtrain launch recipe=gpt_tiny parallel.nnodes=1:2 dp=2 launcher.max_restarts=4 \\
        --node-rank 0 --rdzv-endpoint host0:29500 --rdzv-id exp1      # and on the other node

Rank 0 of every group notes its size and last finished step in ``elastic/progress.json``
after each step (one small file, no collective). A group that starts at another size than
the one before it (a node was lost, or one joined) records the change in
``elastic/changes.jsonl`` at its first step: time, old and new size (processes and nodes),
the steps redone (the old group's last step minus the checkpoint step resumed from) and how
long the change took (old group's last step to the new group's first). ``summary.json``
lists them all (``membership_changes``). Torch-free.
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
        if not self.enabled:
            return
        self.folder.mkdir(exist_ok=True)
        before = self._read(self.progress_file)
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
        tmp = self.folder / f".progress.{os.getpid()}.tmp"
        tmp.write_text(
            json.dumps(
                {"world_size": self.world_size, "nnodes": self.nnodes, "step": step, "time": now}
            )
        )
        tmp.replace(self.progress_file)

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
