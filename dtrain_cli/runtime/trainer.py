"""The training loop: step, then let each component act at its own cadence.

The loop knows nothing about *how* the model is parallel: :func:`parallelize` builds
this rank's part(s) and a step runner (:mod:`.steps`) runs one optimizer step's
forward/backward. Each concern is a component that decides when it acts, as in
torchtitan: :class:`.Checkpointer` (``maybe_save``), :class:`.Validator`
(``should_validate``), :class:`.TrainMetrics` (logging steps, tokens/s),
:class:`.SyncRuntime` (the sync mode: local SGD, DiLoCo, the parameter server),
:class:`.ReplicaChecker`.
Nothing in a step syncs the host with the device or calls a collective the user did not
ask for: the reported loss is summed on device and reduced every ``logging.every`` steps.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.notes import attempt_cause
from dtrain_cli.runtime.components import preemption
from dtrain_cli.runtime.components.checkpointer import Checkpointer
from dtrain_cli.runtime.components.membership import Membership
from dtrain_cli.runtime.components.metrics import TrainMetrics
from dtrain_cli.runtime.components.numerics import NumericsPolicy
from dtrain_cli.runtime.components.profiling import Profiler
from dtrain_cli.runtime.components.replica import ReplicaChecker
from dtrain_cli.runtime.components.sinks import MetricsSink, startup_phases, write_summary
from dtrain_cli.runtime.components.validator import Validator
from dtrain_cli.runtime.data.loader import Batches
from dtrain_cli.runtime.data.stream import BatchLayout, TokenWindows, open_splits
from dtrain_cli.runtime.diagnostics import faults, peak_memory
from dtrain_cli.runtime.diagnostics.watchdog import Watchdog
from dtrain_cli.runtime.parallel.dtensors import local_tensor
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.runtime.parallel.parallelize import parallelize
from dtrain_cli.runtime.state.optim import Optimizers
from dtrain_cli.runtime.state.precision import Precision
from dtrain_cli.runtime.steps import LocalStep, PipelineStep
from dtrain_cli.runtime.sync.base import sync_runtime
from dtrain_cli.strategies import strategy_for

log = logging.getLogger("dtrain")


class Trainer:
    def __init__(
        self,
        cfg: DtrainConfig,
        plan: Plan,
        ctx: DistContext,
        run_dir: Path,
        console: Console | None,
    ) -> None:
        self.cfg, self.plan, self.ctx, self.run_dir = cfg, plan, ctx, run_dir
        self.times: dict[str, float] = {}
        # dropout differs per dp replica and pp stage, init does not; the tp ranks of one
        # replica draw alike (rank of its tp 0: tp is the mesh's innermost dim), as what
        # they hold alike (the residual stream after a row-parallel all-reduce) must stay so
        torch.manual_seed(cfg.train.seed + ctx.rank - ctx.mesh["tp"].get_local_rank())
        self.layout = BatchLayout(
            plan.batch.micro_batch_size, plan.batch.grad_accum, plan.batch.dp, ctx.dp_rank
        )
        splits = open_splits(cfg.data, cfg.model, cfg.train.seed, cfg.run.import_roots)
        self.train_batches = Batches(
            splits["train"], self.layout, cfg.train.seed, ctx.device, cfg.data
        )
        self.val_batches = Batches(splits["val"], self.layout, cfg.train.seed, ctx.device)
        train = splits["train"]  # a token file's identity, kept by checkpoints
        self.train_identity = train.identity if isinstance(train, TokenWindows) else ""
        self.precision = Precision(plan.precision, cfg.precision, ctx.device)
        self._build_model()
        self.memory_measured: dict[str, int] = {}
        # ranks whose loss counts once per dp replica: the last stage, tp rank 0
        self.reports_loss = self.pm.has_last_stage and ctx.mesh["tp"].get_local_rank() == 0
        self._build_components()
        self.step = self.checkpointer.resume()
        if env.restart_count() and ctx.rank == 0 and plan.elastic is None:
            self._say_restarted()
        self.membership = Membership(run_dir, plan, ctx.rank, self.step)
        self.sync.start(self.step)  # param_server: seed the servers, pull
        self.mode_extra: dict[str, Any] = {}
        self._build_metrics(console)
        self.startup_peak = peak_memory.peak_bytes(ctx.device)  # model, data, optimizer, resume

    def _build_model(self) -> None:
        """This rank's model part(s) with the layout applied, the step runner, optimizers."""
        cfg, plan, ctx = self.cfg, self.plan, self.ctx
        pipelined = plan.pipeline is not None
        # the pipeline schedule needs the step's loss function before it exists
        pipeline_loss: list[Any] = []
        self.pm = parallelize(cfg, plan, ctx, loss_fn=lambda o, t: pipeline_loss[0](o, t))
        self.step_fn = (PipelineStep if pipelined else LocalStep)(
            self.pm, plan, self.precision, cfg.run.import_roots
        )
        if isinstance(self.step_fn, PipelineStep):
            pipeline_loss.append(self.step_fn.loss_fn)
        group = self.pm.data_parallel.optimizer_group(ctx)  # zero1: sharded over dp
        self.optimizers = Optimizers(self.pm.parts, cfg.optim, plan.lr, group)
        strategy = strategy_for(plan.strategy)
        sharded = plan.dims.dp_enabled and not strategy.plain_replicas
        # overflow (fp16) must be decided the same everywhere when ranks hold other gradients
        self.overflow_group = (
            dist.group.WORLD if plan.world_size > plan.batch.dp or sharded else None
        )
        self.pp_group = ctx.mesh["pp"].get_group() if pipelined else None

    def _build_components(self) -> None:
        """The components, each deciding when it acts."""
        cfg, plan, ctx, run_dir = self.cfg, self.plan, self.ctx, self.run_dir
        self.sync = sync_runtime(cfg, plan, ctx, self.pm)  # the one sync seam
        if self.sync.replaces_optimizer_step:
            self.optimizers.step_elsewhere()
        self.checkpointer = Checkpointer(
            cfg=cfg,
            plan=plan,
            ctx=ctx,
            run_dir=run_dir,
            pm=self.pm,
            optimizers=self.optimizers,
            precision=self.precision,
            layout=self.layout,
            sync=self.sync,
            train_samples=len(self.train_batches),
            train_identity=self.train_identity,
        )
        self.validator = Validator(
            cfg, plan, ctx, self.pm, self.step_fn, self.val_batches, self.reports_loss
        )
        self.replicas = ReplicaChecker(cfg, plan, ctx, self.pm)
        self.numerics = NumericsPolicy(cfg.train, ctx, self.pm, plan.batch.dp, self.reports_loss)
        watch_s = cfg.debug.collective_timeout_s if cfg.debug.hang_watchdog else 0.0  # 0: off
        self.watchdog = Watchdog(run_dir, ctx.rank, ctx.world_size, watch_s, backend=plan.backend)
        self.profiler = Profiler(cfg.debug.profile_steps, run_dir, ctx.rank, ctx.device)

    def _build_metrics(self, console: Console | None) -> None:
        cfg = self.cfg
        self.sink = None
        if self.ctx.is_logging_rank and console is not None:
            self.sink = MetricsSink(
                self.run_dir,
                self.plan.steps,
                self.step,
                cfg.logging.progress,
                cfg.logging.tensorboard,
                console,
            )
        self.metrics = TrainMetrics(
            plan=self.plan,
            ctx=self.ctx,
            every=cfg.logging.every,
            start_step=self.step,
            reports_loss=self.reports_loss,
            sink=self.sink,
            step_times=lambda: self.pm.data_parallel.step_times(self.pm.parts),
            batches=self.train_batches,
            straggler_factor=cfg.debug.straggler_factor,
            rank_times=cfg.debug.rank_times,
            norm_mean_over_replicas=self.sync.replicas_step_alone,
        )
        self.metrics.carry(self.checkpointer.loaded_rank_state)  # a resume mid-window
        self.checkpointer.window_state = self.metrics.window_state

    # -- the loop -----------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        self.pm.train(True)
        with self.watchdog:
            while self.step < self.plan.steps:
                log_now = self.metrics.is_logging_step(self.step + 1)
                self.watchdog.beat(self.step)
                self.profiler.step_begins(self.step + 1)
                self.metrics.step_begins()
                wall0 = time.perf_counter()
                loss, norm = self.train_step(want_norm=log_now or self.numerics.per_step)
                faults.straggle(self.ctx.rank, time.perf_counter() - wall0)
                self.step += 1
                self.metrics.step_ends(self.step, loss)
                self.profiler.step_ends(self.step)
                if self.step == self.metrics.first_step:
                    self._mark_first_step()
                self.membership.step_done(self.step)
                faults.maybe_fail("kill", step=self.step, rank=self.ctx.rank)
                votes = self.log_step(norm) if log_now else None
                if log_now and (record := self.sync.log_window()) is not None:
                    self.metrics.log(self.step, record, "staleness")
                if self.validator.should_validate(self.step):
                    self.sync.before_validate(self.step)
                    with self.metrics.paused():  # validation: not in tokens/s
                        self.metrics.log(self.step, {"val_loss": self.validator.validate()}, "val")
                asked = votes is not None and (votes.save or votes.stop)  # a logging-step vote
                # a slow save is no hang: the watchdog pauses while it runs
                with self.metrics.paused():
                    self.checkpointer.maybe_save(self.step, self.meta, asked, self.watchdog.paused)
                if votes is not None and votes.stop:
                    return self.preempted()
                if self.sink:
                    self.sink.advance(self.step)
            return self.finish()

    def train_step(self, want_norm: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One optimizer step: forward/backward (the step runner), clip, step. The loss is
        None when the numerics policy dropped the update."""
        step, rank = self.step + 1, self.ctx.rank
        faults.before_step(step, rank)
        if faults.drops_data(step, rank):
            self.train_batches.leave_out_step()
        loss = self.step_fn(self.train_batches, self.step)
        loss = faults.after_backward(loss, self.pm.parameters, step, rank)
        guard = None
        if self.numerics.per_step:
            guard = lambda norm: self.numerics.allow(step, loss, norm)  # noqa: E731
        if self.sync.replaces_optimizer_step:  # param_server: the step is on the servers
            norm = self.sync.optimizer_step(self.step)
        else:
            norm = self.precision.step(
                self.optimizers,
                self.cfg.optim.grad_clip,
                want_norm,
                self.pp_group,
                self.overflow_group,
                guard,
            )
        if not self.memory_measured:
            self.memory_measured = self.measure_memory()
        if guard is not None and not self.numerics.last_allowed:
            self.optimizers.zero_grad()
            if self.numerics.rollback_due:
                self.numerics.rolled_back(step, self.checkpointer.rollback(step))
            return None, norm
        if (record := self.sync.after_optimizer_step()) is not None:  # before zero_grad
            self.metrics.log(step, record, "sync")  # local SGD's drift, DiLoCo's outer step
        faults.after_update(self.pm.parameters, step, rank)
        self.replicas.maybe_check(step)
        self.optimizers.zero_grad()
        self.optimizers.scheduler_step()
        return loss, norm

    def log_step(self, norm: torch.Tensor | None) -> Any:
        """The logging step's one all-reduce: loss, save-time and preemption votes, per-rank
        times; then the on_nan=stop check on its result."""
        step = self.step
        extra = faults.before_logging(step, self.ctx.rank)  # the mismatch drill
        votes = self.metrics.log_step(
            step, norm, self.checkpointer.time_vote(), preemption.requested(), extra,
            lr_steps=self.optimizers.lr_step,
        )  # fmt: skip
        if self.numerics.on_nan == "stop":
            metrics = self.metrics
            self.numerics.check_window(
                step, votes.loss, norm, metrics.last_window, metrics.last_loss_steps
            )
        return votes

    def meta(self) -> dict[str, Any]:
        return {"loss": self.metrics.last_loss, "val_loss": self.validator.last_loss}

    def preempted(self) -> dict[str, Any]:
        self.checkpointer.close()
        self.train_batches.close()
        self.sync.finish(self.step, self.run_dir)  # param_server: the servers stop
        info = preemption.preempted(self.run_dir, self.step, self.ctx.rank)
        dist.barrier()  # no rank exits before the marker is on disk: SLURM's side reads it
        return info

    def finish(self) -> dict[str, Any]:
        self.profiler.close()
        self.checkpointer.close()
        self.train_batches.close()
        self.mode_extra = self.sync.finish(self.step, self.run_dir)  # one model everywhere
        wall = time.perf_counter() - self.metrics.train_start
        return self._summary(wall)

    # -- measurements and the summary ---------------------------------------------------------
    def measure_memory(self) -> dict[str, int]:
        """Bytes this rank actually holds in parameters and optimizer state (local shards)."""
        params = 0
        for p in self.pm.parameters():
            t = local_tensor(p)
            params += t.numel() * t.element_size()
        return {"params": params, "optimizer": self.optimizer_state_bytes()}

    def optimizer_state_bytes(self) -> int:
        """The optimizer's state this rank holds and the sync mode's own (DiLoCo's)."""
        return self.optimizers.state_bytes() + self.sync.state_bytes()

    def _say_restarted(self) -> None:
        """An automatic restart (``launcher.max_restarts``), on the console: which rank
        ended the attempt before, which attempt this is, the checkpoint it goes on from.
        (An elastic run's membership change says so itself: :class:`.Membership`.)"""
        attempt = env.restart_count()
        ckpt = self.checkpointer.resumed_from
        log.warning(
            "restarted (attempt %d of %d) after %s; %s",
            attempt,
            self.plan.max_restarts,
            attempt_cause(self.run_dir, attempt - 1, self.plan.world_size),
            f"resuming from checkpoint {ckpt} (step {self.step})"
            if ckpt
            else "starting from step 0 (no complete checkpoint yet)",
        )

    def _mark_first_step(self) -> None:
        """The run trained: rank 0 says so in the run dir (the launcher keeps a dir that
        trained), every rank logs its start-up breakdown."""
        self.times["first_step_done"] = time.time()
        t0 = env.launch_started_at()
        phases = startup_phases(self.times, t0)
        took = self.times["first_step_done"] - t0
        if self.ctx.rank == 0:
            protocol.write_first_step(RunDir(self.run_dir), {"step": self.step, "after_s": took})
        shown = " · ".join(f"{k} {v:.2f}" for k, v in phases.items())
        log.info("first step done %.2f s after launch (%s)", took, shown)

    def _summary(self, wall: float) -> dict[str, Any]:
        t0 = env.launch_started_at()
        startup = {k: round(v - t0, 3) for k, v in self.times.items()}
        est = self.plan.estimates
        steps_run = self.step - self.metrics.first_step + 1
        summary = {
            "recipe": self.plan.recipe,
            "world_size": self.plan.world_size,
            "steps": self.step,
            "final_loss": self.metrics.last_loss,
            "val_loss": self.validator.last_loss,
            f"{self.plan.batch.unit}_per_s": self.metrics.median_tokens_per_s(),
            "mfu": self.metrics.measured_mfu(self.cfg.hardware),
            "train_wall_s": wall,
            "params": est.num_params,
            **self.replicas.summary(),
            **self.numerics.summary(),
            **self.metrics.rank_summary(),
            "resumed_from": self.checkpointer.resumed_from,
            "membership_changes": self.membership.changes(),
            **self.membership.summary(wall),  # elastic: the whole run, the sizes it ran at
            "checkpoint_stall_s": self.checkpointer.save_stall_s,
            "data_wait_ms_per_step": 1000 * self.train_batches.wait_s / max(1, steps_run),
            "strategy": self.plan.strategy,
            "memory_params_bytes": {
                "estimate": est.bytes_params,
                "measured": self.memory_measured.get("params"),
            },
            "memory_optimizer_bytes": {
                "estimate": est.bytes_optimizer,
                "measured": self.memory_measured.get("optimizer"),
            },
            "comm_bytes_per_step_estimate": est.comm_bytes_per_step,
            **self.metrics.bubble_report(),
            **{f"startup_{k}_s": v for k, v in startup.items()},
            "startup_phases_s": {k: round(v, 3) for k, v in startup_phases(self.times, t0).items()},
            "startup_peak_bytes": self.startup_peak,
            **self.mode_extra,
        }
        if self.ctx.is_logging_rank:
            write_summary(self.run_dir, summary)
            if self.sink:
                self.sink.print_summary(summary, self.run_dir)
        return summary
