"""The training loop: step, log, validate, checkpoint at step boundaries.

The loop knows nothing about *how* the model is parallel: :func:`parallelize` builds
this rank's part(s) and a step runner (:mod:`.steps`) runs one optimizer step's
forward/backward. Nothing in a step syncs the host with the device or calls a collective
the user did not ask for: the reported loss is summed on device and reduced every
``logging.every`` steps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rich.console import Console

from dtrain_cli.checkpoint.catalog import newest_complete
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime import faults, preemption
from dtrain_cli.runtime.checkpoint import CheckpointManager
from dtrain_cli.runtime.data import BatchLayout, open_splits
from dtrain_cli.runtime.data_parallel import LocalSGD, ddp_step_times
from dtrain_cli.runtime.distributed import DistContext
from dtrain_cli.runtime.dtensors import full_tensor, local_tensor
from dtrain_cli.runtime.loader import Batches
from dtrain_cli.runtime.metrics import (
    FIRST_STEP_DONE,
    MetricsSink,
    startup_phases,
    truncate_metrics,
)
from dtrain_cli.runtime.optim import Optimizers
from dtrain_cli.runtime.parallelize import parallelize
from dtrain_cli.runtime.precision import Precision
from dtrain_cli.runtime.steps import LocalStep, PipelineStep
from dtrain_cli.runtime.sync_modes import ModeSync

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
        torch.manual_seed(cfg.train.seed + ctx.rank)  # dropout differs per rank, init does not
        splits = open_splits(cfg.data, cfg.model, cfg.train.seed)
        self.layout = BatchLayout(
            plan.batch.micro_batch_size, plan.batch.grad_accum, plan.batch.dp, ctx.dp_rank
        )
        self.train_batches = Batches(
            splits["train"], self.layout, cfg.train.seed, ctx.device, cfg.data
        )
        self.val_batches = Batches(splits["val"], self.layout, cfg.train.seed, ctx.device)
        self.precision = Precision(plan.precision, cfg.precision, ctx.device)
        pipelined = plan.pipeline is not None
        # the pipeline schedule needs the step's loss function before it exists
        self._pipeline_loss: list[Any] = []
        self.pm = parallelize(cfg, plan, ctx, loss_fn=lambda o, t: self._pipeline_loss[0](o, t))
        self.step_fn = (PipelineStep if pipelined else LocalStep)(
            self.pm, plan, self.precision, cfg.run.import_roots
        )
        if isinstance(self.step_fn, PipelineStep):
            self._pipeline_loss.append(self.step_fn.loss_fn)
        sharded_dp = plan.strategy in ("zero1", "fsdp") and plan.batch.dp > 1
        zero_group = ctx.dp_group if plan.strategy == "zero1" and plan.batch.dp > 1 else None
        self.optimizers = Optimizers(self.pm.parts, cfg.optim, plan.lr, zero_group)
        self.local_sgd = (
            LocalSGD(cfg, self.pm.parameters(), ctx.dp_group)
            if cfg.sync.mode == "local_sgd" and plan.batch.dp > 1
            else None
        )
        # overflow (fp16) must be decided the same everywhere when ranks hold other gradients
        self.overflow_group = (
            dist.group.WORLD if plan.world_size > plan.batch.dp or sharded_dp else None
        )
        self.memory_measured: dict[str, int] = {}
        # ranks whose loss counts once per dp replica: the last stage, tp rank 0
        self.reports_loss = self.pm.has_last_stage and ctx.mesh["tp"].get_local_rank() == 0
        self.pp_group = ctx.mesh["pp"].get_group() if pipelined else None
        self.step = 0
        self.last_val_loss: float | None = None
        self.last_loss = float("nan")
        self.checkpoints = CheckpointManager(
            run_dir, ctx.rank, cfg.checkpoint.keep_last, cfg.checkpoint.async_save
        )
        self.resumed_from: str | None = None
        self.busy_s = self.step_wall_s = 0.0
        self.steps_run = 0
        self.mode_sync = ModeSync(cfg, plan, ctx, self.pm)  # param_server / diloco
        self.resume()
        self.mode_sync.start(self.step)
        self.sink = None
        if ctx.is_logging_rank and console is not None:
            self.sink = MetricsSink(
                run_dir,
                plan.steps,
                self.step,
                cfg.logging.progress,
                cfg.logging.tensorboard,
                console,
            )

    # -- checkpoint state ---------------------------------------------------------------------
    def model_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        out: dict[str, Any] = {}
        for part in self.pm.parts:
            out.update(get_model_state_dict(part))
        return out

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: DCP state dicts keyed by full-model names, so any
        layout (dp, tp, pp) loads any other."""
        samples = self.layout.step_start(self.step)
        state: dict[str, Any] = {
            "model": self.model_state(),
            "optim": self.optimizers.state_dict(),
            "train": {
                "step": torch.tensor(self.step),
                "samples_seen": torch.tensor(samples),
                "tokens_seen": torch.tensor(samples * self.plan.batch.seq_len),
                "lr_step": torch.tensor(self.optimizers.lr_step),
            },
        }
        if self.precision.scaler is not None:
            state["scaler"] = self.precision.scaler.state_dict()
        if sync_state := self.mode_sync.state():
            state["sync"] = sync_state
        return state

    def resume(self) -> None:
        """Continue from the newest complete checkpoint of this run, if there is one: after
        ``dtrain resume``, and when the elastic agent restarted the workers after a failure."""
        path = newest_complete(self.run_dir, warn=log.warning)
        if path is None:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        state = self.state()
        self.checkpoints.load(path, state)
        for part in self.pm.parts:
            set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        self.optimizers.load_state_dict(state["optim"])
        if self.precision.scaler is not None and "scaler" in state:
            self.precision.scaler.load_state_dict(state["scaler"])
        train = state["train"]
        self.step = int(train["step"])
        self.layout.base_step, self.layout.base_samples = self.step, int(train["samples_seen"])
        self.optimizers.lr_step = int(train["lr_step"])
        if self.local_sgd is not None:
            self.local_sgd.set_step(self.step)
        self.mode_sync.after_load(state.get("sync", {}), self.step)
        for part in self.pm.parts:
            if hasattr(getattr(part, "comm_state", None), "iter"):
                part.comm_state.iter = self.step  # post-local-SGD warm-up counts steps
        self.resumed_from = path.name
        if self.ctx.is_logging_rank:
            truncate_metrics(self.run_dir / "metrics.jsonl", self.step)
        log.info(
            "resumed from %s: step %d, %d samples seen", path, self.step, self.layout.base_samples
        )

    def save_checkpoint(self) -> None:
        if self.local_sgd is not None:  # replicas may differ between averagings: save one
            self.local_sgd.average_now()
        self.mode_sync.before_save(self.step)
        meta = {
            "step": self.step,
            "samples_seen": self.layout.step_start(self.step),
            "tokens_seen": self.layout.step_start(self.step) * self.plan.batch.seq_len,
            "loss": self.last_loss,
            "val_loss": self.last_val_loss,
            "world_size": self.plan.world_size,
            "mesh": dict(zip(self.plan.mesh.dim_names, self.plan.mesh.shape, strict=True)),
            "model": self.pm.spec.config_dict(),
        }
        files = {name: (self.run_dir / name).read_text() for name in ("config.yaml", "plan.yaml")}
        self.checkpoints.save(self.step, self.state(), meta, files)

    # -- one optimizer step ---------------------------------------------------------------
    def train_step(self, want_norm: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        loss = self.step_fn(self.train_batches, self.step)
        if self.mode_sync.replaces_optimizer_step:  # param_server: the step is on the servers
            norm = self.mode_sync.optimizer_step(self.step)
        else:
            norm = self.precision.step(
                self.optimizers,
                self.cfg.optim.grad_clip,
                want_norm,
                self.pp_group,
                self.overflow_group,
            )
        outer = self.mode_sync.after_optimizer_step()  # diloco's outer step
        if outer and self.sink:
            self.sink.log(self.step + 1, outer, kind="sync")
        if not self.memory_measured:
            self.memory_measured = self.measure_memory()
        if self.local_sgd is not None:  # before zero_grad: torch averages params with grads
            self.local_sgd.after_step()
            if self.local_sgd.last_divergence is not None:
                if self.sink:
                    self.sink.log(
                        self.step + 1,
                        {
                            "divergence": self.local_sgd.last_divergence,
                            "identical_after": float(self.local_sgd.identical_after),
                        },
                        kind="sync",
                    )
                self.local_sgd.last_divergence = None
        self.optimizers.zero_grad()
        self.optimizers.scheduler_step()
        return loss, norm

    def measure_memory(self) -> dict[str, int]:
        """Bytes this rank actually holds in parameters and optimizer state (local shards)."""
        params = 0
        for p in self.pm.parameters():
            t = local_tensor(p)
            params += t.numel() * t.element_size()
        return {"params": params, "optimizer": self.optimizers.state_bytes()}

    def comm_times(self) -> dict[str, float]:
        """Forward / backward / communication times of the latest logging step (DDP's own
        runtime logging), to show whether communication hides behind backward."""
        for part in self.pm.parts:
            times = ddp_step_times(part)
            if times:
                return times
        return {}

    @torch.no_grad()  # a graph-building eval forward through DDP perturbs the next steps
    def evaluate(self) -> float:
        """Mean loss over the first ``eval_batches`` global batches of the val split (the
        same samples whatever the layout), micro-batches dealt round-robin to dp ranks and
        grouped by pipeline calls."""
        self.pm.train(False)
        micro, dp, r = self.plan.batch.micro_batch_size, self.plan.batch.dp, self.ctx.dp_rank
        group = self.plan.pipeline.microbatches if self.plan.pipeline else 1
        n = len(self.val_batches)
        chunks = list(
            range(r, self.cfg.train.eval_batches * self.plan.batch.global_batch_size // micro, dp)
        )
        totals = torch.zeros(2, device=self.ctx.device, dtype=torch.float64)
        for i in range(0, len(chunks), group):
            idx = np.concatenate([np.arange(micro) + c * micro for c in chunks[i : i + group]]) % n
            x, y = self.val_batches.fetch(idx)
            loss = self.step_fn.eval_loss(x, y)
            if self.reports_loss:
                totals += torch.stack(
                    [loss.double() * len(idx), torch.tensor(len(idx), device=self.ctx.device)]
                )
        dist.all_reduce(totals)
        self.pm.train(True)
        return (totals[0] / totals[1]).item()

    # -- the loop -----------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg, plan = self.cfg, self.plan
        every, eval_every = cfg.logging.every, cfg.train.eval_every
        save_steps = set(plan.checkpoint.steps)
        save_every_s = 60.0 * plan.checkpoint.every_minutes
        tokens_per_step = plan.batch.tokens_per_step
        # [loss sum, "time to save" votes, "stop" votes]: one all-reduce, at logging steps
        window = torch.zeros(3, device=self.ctx.device)
        window_losses: list[torch.Tensor] = []
        window_steps, window_start = 0, time.perf_counter()
        train_start, first_step = window_start, self.step + 1
        tokens_per_s: list[float] = []
        self.pm.train(True)
        stop = False  # preemption: checkpoint at this step boundary, then return (preemption.py)
        while self.step < plan.steps:
            log_now = (self.step + 1) % every == 0 or self.step + 1 == plan.steps
            wall0, cpu0 = time.perf_counter(), time.process_time()
            loss, norm = self.train_step(want_norm=log_now)
            faults.straggle(self.ctx.rank, time.perf_counter() - wall0)
            if self.step >= first_step:  # busy vs wall per step, after the warm-up step
                self.busy_s += time.process_time() - cpu0
                self.step_wall_s += time.perf_counter() - wall0
            window_losses.append(loss)
            window_steps += 1
            self.step += 1
            if self.step == first_step:
                self._mark_first_step()
            faults.maybe_fail("kill", step=self.step, rank=self.ctx.rank)
            save_now = self.step in save_steps
            if log_now:
                if save_every_s and time.monotonic() - self.checkpoints.last_save_time >= (
                    save_every_s
                ):
                    window[1] = 1.0
                if preemption.requested():
                    window[2] = 1.0
                if self.reports_loss:
                    window[0] = torch.stack(window_losses).sum()
                dist.all_reduce(window, op=dist.ReduceOp.SUM)  # over all ranks: see reports_loss
                loss_sum, save_votes, stop_votes = window.tolist()
                self.last_loss = loss_sum / (window_steps * plan.batch.dp)
                stop = stop_votes > 0 and self.step < plan.steps
                save_now = save_now or save_votes > 0 or stop
                now = time.perf_counter()
                elapsed = now - window_start  # the record written below counts in the next window
                tps = tokens_per_step * window_steps / elapsed
                if self.step - window_steps >= first_step:  # first window: warm-up costs
                    tokens_per_s.append(tps)
                if self.sink:
                    self.sink.log(
                        self.step,
                        {
                            "loss": self.last_loss,
                            "lr": self.plan.lr.lr_at(self.step - 1),
                            "grad_norm": float(norm) if norm is not None else float("nan"),
                            f"{plan.batch.unit}_per_s": tps,
                            "step_time_ms": 1000 * elapsed / window_steps,
                            **self.comm_times(),
                        },
                    )
                if (record := self.mode_sync.log_window()) is not None and self.sink:
                    self.sink.log(self.step, record, kind="staleness")
                window.zero_()
                window_losses.clear()
                window_steps, window_start = 0, now
            if (eval_every and self.step % eval_every == 0) or self.step == plan.steps:
                self.mode_sync.before_validate(self.step)
                self.last_val_loss = self.evaluate()
                if self.sink:
                    self.sink.log(self.step, {"val_loss": self.last_val_loss}, kind="val")
                window_start = time.perf_counter()  # keep validation out of tokens/s
            if save_now:
                self.save_checkpoint()
                window_start = time.perf_counter()
            self.checkpoints.poll()
            if stop:
                self.checkpoints.close()
                self.train_batches.close()
                self.mode_sync.finish(self.step, self.run_dir)  # param_server: servers stop
                info = preemption.preempted(self.run_dir, self.step, self.ctx.rank)
                dist.barrier()  # no rank exits before the marker is on disk: SLURM's side reads it
                return info
            if self.sink:
                self.sink.advance(self.step)
        self.checkpoints.close()
        self.train_batches.close()
        if self.local_sgd is not None:
            self.local_sgd.average_now()
        self.mode_extra = self.mode_sync.finish(self.step, self.run_dir)
        self.steps_run = self.step - first_step + 1
        wall = time.perf_counter() - train_start
        return self._summary(wall, tokens_per_s)

    def replica_digests(self) -> list[str]:
        """sha256 of this rank's parameter bytes (local shards: the same tp shard / pp stage
        across the dp group), gathered over the dp group: data-parallel replicas must hold
        bit-identical parameters. FSDP (dp > 1) has no replicas: each dp rank holds another
        shard, so the digest is of the full parameters and there is nothing to compare."""
        h = hashlib.sha256()
        sharded = self.replicas_check() is not None
        for p in self.pm.parameters():
            t = full_tensor(p) if sharded else local_tensor(p)  # collective under FSDP
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        if sharded:
            return [h.hexdigest()]
        out: list[str | None] = [None] * self.plan.batch.dp
        dist.all_gather_object(out, h.hexdigest(), group=self.ctx.dp_group)
        return [str(d) for d in out]

    def replicas_check(self) -> str | None:
        """Why the replica check does not apply to this layout (None: it does)."""
        if self.plan.strategy == "fsdp" and self.plan.batch.dp > 1:
            return "not applicable: fsdp shards the parameters over dp (no replicas to compare)"
        return None

    def param_moments(self) -> tuple[float, float]:
        """Sum and sum of squares of the full model's parameters, whatever the layout."""
        sums = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        counts_once = self.ctx.dp_rank == 0 and self.ctx.mesh["tp"].get_local_rank() == 0
        for p in self.pm.parameters():
            full = full_tensor(p)  # collective under TP
            if counts_once:
                full = full.detach().double()
                sums += torch.stack([full.sum(), full.square().sum()])
        dist.all_reduce(sums)
        return float(sums[0]), float(sums[1])

    def bubble_report(self) -> dict[str, Any]:
        """Measured idle fraction per pipeline stage (1 - CPU busy time / step wall time,
        averaged over the stage's ranks) next to the theory. On CUDA, host CPU time does not
        measure kernels, so only the theory is reported."""
        pipe = self.plan.pipeline
        if pipe is None:
            return {}
        idle = 1.0 - self.busy_s / self.step_wall_s if self.step_wall_s > 0 else float("nan")
        rows: list[Any] = [None] * self.plan.world_size
        dist.all_gather_object(rows, (self.ctx.mesh["pp"].get_local_rank(), idle))
        per_rank: dict[int, list[float]] = {}
        for pp_rank, value in rows:
            per_rank.setdefault(pp_rank, []).append(value)
        measured = [round(float(np.mean(v)), 4) for _, v in sorted(per_rank.items())]
        report: dict[str, Any] = {"bubble_theory": round(pipe.bubble, 4)}
        if self.ctx.device.type == "cpu":
            report["bubble_measured_per_pp_rank"] = measured
            report["bubble_measured"] = round(float(np.mean(measured)), 4)
        return report

    def _mark_first_step(self) -> None:
        self.times["first_step_done"] = time.time()
        t0 = float(os.environ.get("DTRAIN_LAUNCH_T0", "nan"))
        phases = " · ".join(f"{k} {v:.2f}" for k, v in startup_phases(self.times, t0).items())
        took = self.times["first_step_done"] - t0
        log.info("%s %.2f s after launch (%s)", FIRST_STEP_DONE, took, phases)

    def _summary(self, wall: float, tokens_per_s: list[float]) -> dict[str, Any]:
        t0 = float(os.environ.get("DTRAIN_LAUNCH_T0", "nan"))
        startup = {k: round(v - t0, 3) for k, v in self.times.items()}
        digests = self.replica_digests()
        est = self.plan.estimates
        param_sum, param_sq_sum = self.param_moments()
        summary = {
            "recipe": self.plan.recipe,
            "world_size": self.plan.world_size,
            "steps": self.step,
            "final_loss": self.last_loss,
            "val_loss": self.last_val_loss,
            f"{self.plan.batch.unit}_per_s": (
                float(np.median(tokens_per_s)) if tokens_per_s else float("nan")
            ),
            "train_wall_s": wall,
            "params": self.plan.estimates.num_params,
            "param_sum": param_sum,
            "param_sq_sum": param_sq_sum,
            "param_digest": digests[0],
            "replicas_identical": None if self.replicas_check() else len(set(digests)) == 1,
            "replicas_check": self.replicas_check(),
            "resumed_from": self.resumed_from,
            "checkpoint_stall_s": self.checkpoints.save_stall_s,
            "data_wait_ms_per_step": 1000 * self.train_batches.wait_s / max(1, self.steps_run),
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
            **self.bubble_report(),
            **{f"startup_{k}_s": v for k, v in startup.items()},
            "startup_phases_s": {k: round(v, 3) for k, v in startup_phases(self.times, t0).items()},
            **getattr(self, "mode_extra", {}),
        }
        if self.ctx.is_logging_rank:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            if self.sink:
                self.sink.print_summary(summary, self.run_dir)
        return summary
