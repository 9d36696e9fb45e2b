"""The loop's checkpointing component: what a checkpoint holds, when to save, resume.

    dtrain launch recipe=gpt_tiny checkpoint.every_steps=50 checkpoint.every_minutes=30
    dtrain resume --ckpt runs/<run>

``maybe_save(step, ...)`` decides its own cadence: the plan's save steps (every N, the
end), a vote at a logging step (time since the last save, a preemption stop), or an
explicit request. The time vote is read on every rank and summed in the logging
all-reduce (:mod:`.train_metrics`), so every rank saves at the same step. ``rollback``
restores the newest complete checkpoint's model and optimizer but keeps the step and the
data position: the loop moves past the data it trained on since (:mod:`.numerics`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from dtrain_cli.checkpoint.catalog import newest_complete, read_meta
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.runtime.components.sinks import truncate_metrics
from dtrain_cli.runtime.data.stream import BatchLayout
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.runtime.parallel.parallelize import ParallelModel
from dtrain_cli.runtime.state.dcp import CheckpointManager
from dtrain_cli.runtime.state.optim import Optimizers
from dtrain_cli.runtime.state.precision import Precision
from dtrain_cli.runtime.sync.base import SyncRuntime

log = logging.getLogger("dtrain")


class Checkpointer:
    def __init__(
        self,
        *,
        cfg: DtrainConfig,
        plan: Plan,
        ctx: DistContext,
        run_dir: Path,
        pm: ParallelModel,
        optimizers: Optimizers,
        precision: Precision,
        layout: BatchLayout,
        sync: SyncRuntime,
        train_samples: int,
        train_identity: str = "",
    ) -> None:
        self.plan, self.ctx, self.run_dir = plan, ctx, run_dir
        self.train_samples = train_samples  # the data's size, kept with each checkpoint
        self.train_identity = train_identity  # its token file's (stream.file_identity)
        self.pm, self.optimizers, self.precision = pm, optimizers, precision
        self.layout = layout
        self.sync = sync  # the sync mode's state goes into checkpoints under "sync"
        self.loaded_sync: dict[str, Any] = {}
        self.loaded_rank_state: dict[str, torch.Tensor] = {}
        self.window_state: Callable[[], dict[str, torch.Tensor]] = dict
        """The metrics' open window (set once they exist: :meth:`TrainMetrics.window_state`)."""
        self.manager = CheckpointManager(
            run_dir, ctx.rank, cfg.checkpoint.keep_last, cfg.checkpoint.async_save
        )
        # the RNG a rank resumes with: its tp group's first rank's, as the trainer seeds it
        # (the tp ranks of a replica draw alike: runtime/trainer.py)
        self.manager.rng_rank = ctx.rank - ctx.mesh["tp"].get_local_rank()
        self.save_steps = set(plan.checkpoint.steps)
        self.every_s = 60.0 * plan.checkpoint.every_minutes
        self.resumed_from: str | None = None

    # -- what a checkpoint holds ------------------------------------------------------------
    def model_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        out: dict[str, Any] = {}
        for part in self.pm.parts:
            out.update(get_model_state_dict(part))
        return out

    @property
    def optim_key(self) -> str:
        """Replicas that step alone (local SGD, DiLoCo) each keep optimizer state of their
        own: one entry per replica, where DCP would otherwise keep one copy for all."""
        return f"optim_replica_{self.ctx.dp_rank}" if self.sync.replicas_step_alone else "optim"

    def state(self, step: int) -> dict[str, Any]:
        """DCP state dicts keyed by full-model names, so any layout (dp, tp, pp) loads any
        other."""
        samples = self.layout.step_start(step)
        state: dict[str, Any] = {
            "model": self.model_state(),
            self.optim_key: self.optimizers.state_dict(),
            "train": {
                "step": torch.tensor(step),
                "samples_seen": torch.tensor(samples),
                "tokens_seen": torch.tensor(samples * self.plan.batch.seq_len),
                "lr_step": torch.tensor(self.optimizers.lr_step),
            },
        }
        if self.precision.scaler is not None:
            state["scaler"] = self.precision.scaler.state_dict()
        if sync_state := self.sync.state():
            state["sync"] = sync_state
        return state

    def _restore(self, path: Path, step: int) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        state = self.state(step)
        self.loaded_rank_state = self.manager.load(path, state)
        for part in self.pm.parts:
            set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        self.optimizers.load_state_dict(state[self.optim_key])
        if self.precision.scaler is not None and "scaler" in state:
            self.precision.scaler.load_state_dict(state["scaler"])
        self.optimizers.lr_step = int(state["train"]["lr_step"])
        self.loaded_sync = state.get("sync", {})
        return state["train"]

    def resume(self) -> int:
        """The step to start from: the newest complete checkpoint's (after ``dtrain resume``,
        and when the elastic agent restarted the workers after a failure), else 0."""
        path = newest_complete(self.run_dir, warn=log.warning)
        if path is None:  # a restart before the first checkpoint starts over: so do metrics
            if self.ctx.is_logging_rank:
                truncate_metrics(RunDir(self.run_dir).metrics, 0)
            return 0
        train = self._restore(path, 0)
        step = int(train["step"])
        self.layout.base_step, self.layout.base_samples = step, int(train["samples_seen"])
        self.pm.data_parallel.load_rank_state(self.pm.parts, self.loaded_rank_state, step)
        self.sync.on_resume(self.loaded_sync, step)
        self.resumed_from = path.name
        if self.ctx.is_logging_rank:
            truncate_metrics(RunDir(self.run_dir).metrics, step)
            self._say_if_data_changed(path, step)
        log.info("resumed from %s: step %d, %d samples seen", path, step, self.layout.base_samples)
        return step

    def _say_if_data_changed(self, path: Path, step: int) -> None:
        """The sample order is a permutation of the training samples: other data (a file
        appended to, added or removed) draws other samples from here on, which ``dtrain
        resume`` would otherwise continue silently as if exact."""
        meta = read_meta(path)
        then, files = meta.get("train_samples"), meta.get("train_data")
        if then is None or then == self.train_samples:
            if files and self.train_identity and files != self.train_identity:
                log.warning(
                    "the training data's token file is not the one %s was saved with (%s "
                    "then, %s now: the files behind data.path changed, or moved): the run "
                    "continues, maybe on other samples than the original run's",
                    path.name, files, self.train_identity,
                )  # fmt: skip
            return
        log.warning(
            "the training data changed since %s was saved (%s samples then, %s now): the run "
            "continues, but from step %d on it draws other samples than the original run "
            "would have (for the same run, resume with the data as it was)",
            path.name, f"{then:,}", f"{self.train_samples:,}", step + 1,
        )  # fmt: skip

    def rollback(self, step: int) -> int | None:
        """Model, optimizer and LR position from the newest complete checkpoint; the step
        and data position stay (the data since that checkpoint is skipped). Returns the
        checkpoint's step, or None when there is none. Every rank calls it together."""
        self.manager.wait()
        path = newest_complete(self.run_dir, warn=log.warning)
        if path is None:
            return None
        train = self._restore(path, step)
        return int(train["step"])

    # -- when to save ---------------------------------------------------------------------
    def time_vote(self) -> bool:
        """This rank thinks a time-based save is due (summed over ranks at a logging step)."""
        return bool(self.every_s) and time.monotonic() - self.manager.last_save_time >= (
            self.every_s
        )

    def maybe_save(
        self,
        step: int,
        meta: Callable[[], dict[str, Any]],
        asked: bool = False,
        during: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> bool:
        """Save at the plan's steps or when ``asked`` (a vote, a preemption stop), inside
        ``during()`` (the watchdog's pause); ``meta()`` is read only then: a step that
        saves nothing does no more than poll a background save."""
        if not asked and step not in self.save_steps:
            self.manager.poll()
            return False
        with during():
            self.save(step, meta())
        self.manager.poll()
        return True

    def save(self, step: int, meta: dict[str, Any]) -> None:
        self.sync.before_save(step)  # one model (local SGD); the servers' state (param_server)
        samples = self.layout.step_start(step)
        info = {
            "step": step,
            "samples_seen": samples,
            # a model of samples (images, your dataset's items) sees no tokens
            "tokens_seen": samples * self.plan.batch.seq_len
            if self.plan.batch.unit == "tokens"
            else None,
            **meta,
            "world_size": self.plan.world_size,
            "mesh": dict(zip(self.plan.mesh.dim_names, self.plan.mesh.shape, strict=True)),
            "model": self.pm.spec.config_dict(),
            "train_samples": self.train_samples,
            "train_data": self.train_identity,
        }
        run = RunDir(self.run_dir)  # the checkpoint keeps both under the run dir's names
        files = {path.name: path.read_text() for path in (run.config, run.plan)}
        rank_state = self.pm.data_parallel.rank_state(self.pm.parts)  # PowerSGD's, per rank
        rank_state.update(self.window_state())  # the logging window's steps so far
        self.manager.save(step, self.state(step), info, files, rank_state)

    def close(self) -> None:
        self.manager.close()

    @property
    def save_stall_s(self) -> list[float]:
        return self.manager.save_stall_s
