"""The training loop: step, log, validate (checkpoint hooks slot in at step boundaries).

The loop knows nothing about *how* the model is parallel: :func:`parallelize` wraps it,
and the step asks the wrapper only for ``no_sync`` (DDP's skip of the all-reduce on
non-final micro-steps). Nothing in a step syncs the host with the device or calls a
collective the user did not ask for: the loss is summed on device and reduced across
dp ranks every ``logging.every`` steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rich.console import Console

from dtrain_cli.checkpoint.catalog import newest_complete
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime import faults
from dtrain_cli.runtime.checkpoint import (
    CheckpointManager,
    apply_model_and_optimizer_state,
    model_and_optimizer_state,
)
from dtrain_cli.runtime.data import BatchLayout, SampleStream, TokenWindows, open_splits
from dtrain_cli.runtime.distributed import DistContext
from dtrain_cli.runtime.metrics import MetricsSink, summary_table, truncate_metrics
from dtrain_cli.runtime.model import build_model, lm_loss
from dtrain_cli.runtime.optim import build_optimizer, build_scheduler
from dtrain_cli.runtime.parallelize import parallelize
from dtrain_cli.runtime.precision import Precision

log = logging.getLogger("dtrain")


class Batches:
    """This rank's micro-batches of the global sample stream (see :mod:`.data`)."""

    def __init__(
        self, windows: TokenWindows, layout: BatchLayout, seed: int, device: torch.device
    ) -> None:
        self.windows = windows
        self.layout = layout
        self.stream = SampleStream(len(windows), seed)
        self.device = device
        self.pin = device.type == "cuda"

    def micro_batch(self, step: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.layout.micro_start(step, micro_step)
        idx = self.stream.indices(start, self.layout.micro_batch_size)
        return self.to_device(self.windows.gather(idx))

    def to_device(self, array: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.from_numpy(array)
        if self.pin:
            t = t.pin_memory().to(self.device, non_blocking=True)
        return t[:, :-1], t[:, 1:]


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
        self.train_batches = Batches(splits["train"], self.layout, cfg.train.seed, ctx.device)
        self.val_windows = splits["val"]
        model = build_model(cfg.model, cfg.train.seed, ctx.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.model = parallelize(model, cfg, ctx)
        self.optimizer = build_optimizer(model, cfg.optim, plan.lr.peak_lr)
        self.scheduler = build_scheduler(self.optimizer, plan.lr)
        self.precision = Precision(plan.precision, cfg.precision, ctx.device)
        self.step = 0
        self.last_val_loss: float | None = None
        self.last_loss = float("nan")
        self.checkpoints = CheckpointManager(
            run_dir, ctx.rank, cfg.checkpoint.keep_last, cfg.checkpoint.async_save
        )
        self.resumed_from: str | None = None
        self.resume()
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
    def state(self) -> dict[str, Any]:
        """What a checkpoint holds, as DCP state dicts (layout-independent names)."""
        model_sd, optim_sd = model_and_optimizer_state(self.model, self.optimizer)
        samples = self.layout.step_start(self.step)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "train": {
                "step": torch.tensor(self.step),
                "samples_seen": torch.tensor(samples),
                "tokens_seen": torch.tensor(samples * self.plan.batch.seq_len),
                "lr_step": torch.tensor(self.scheduler.last_epoch),
            },
        }
        if self.precision.scaler is not None:
            state["scaler"] = self.precision.scaler.state_dict()
        return state

    def resume(self) -> None:
        """Continue from the newest complete checkpoint of this run, if there is one: after
        ``dtrain resume``, and when the elastic agent restarted the workers after a failure."""
        path = newest_complete(self.run_dir, warn=log.warning)
        if path is None:
            return
        state = self.state()
        self.checkpoints.load(path, state)
        apply_model_and_optimizer_state(self.model, self.optimizer, state["model"], state["optim"])
        if self.precision.scaler is not None and "scaler" in state:
            self.precision.scaler.load_state_dict(state["scaler"])
        train = state["train"]
        self.step = int(train["step"])
        self.layout.base_step, self.layout.base_samples = self.step, int(train["samples_seen"])
        self.scheduler.last_epoch = int(train["lr_step"])
        for group, factor in zip(
            self.optimizer.param_groups, self.scheduler.lr_lambdas, strict=True
        ):
            group["lr"] = group["initial_lr"] * factor(self.scheduler.last_epoch)
        self.resumed_from = path.name
        if self.ctx.is_logging_rank:
            truncate_metrics(self.run_dir / "metrics.jsonl", self.step)
        log.info(
            "resumed from %s: step %d, %d samples seen", path, self.step, self.layout.base_samples
        )

    def save_checkpoint(self) -> None:
        meta = {
            "step": self.step,
            "samples_seen": self.layout.step_start(self.step),
            "tokens_seen": self.layout.step_start(self.step) * self.plan.batch.seq_len,
            "loss": self.last_loss,
            "val_loss": self.last_val_loss,
            "world_size": self.plan.world_size,
            "mesh": dict(zip(self.plan.mesh.dim_names, self.plan.mesh.shape, strict=True)),
            "model": asdict(self.cfg.model),
        }
        files = {name: (self.run_dir / name).read_text() for name in ("config.yaml", "plan.yaml")}
        self.checkpoints.save(self.step, self.state(), meta, files)

    # -- one optimizer step ---------------------------------------------------------------
    def train_step(self, want_norm: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        accum = self.plan.batch.grad_accum
        loss_sum = torch.zeros((), device=self.ctx.device)
        no_sync = getattr(self.model, "no_sync", contextlib.nullcontext)
        for k in range(accum):
            x, y = self.train_batches.micro_batch(self.step, k)
            sync_now = k == accum - 1
            with contextlib.nullcontext() if sync_now else no_sync():
                with self.precision.autocast():
                    loss = lm_loss(self.model(x), y) / accum
                self.precision.backward(loss)
            loss_sum += loss.detach()
        norm = self.precision.step(self.optimizer, self.params, self.cfg.optim.grad_clip, want_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss_sum, norm

    # -- validation -------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the first ``eval_batches`` global batches of the val split (the
        same samples whatever the layout), micro-batches dealt round-robin to dp ranks."""
        self.model.eval()
        micro, dp, r = self.plan.batch.micro_batch_size, self.plan.batch.dp, self.ctx.dp_rank
        n = len(self.val_windows)
        chunks = self.cfg.train.eval_batches * self.plan.batch.global_batch_size // micro
        totals = torch.zeros(2, device=self.ctx.device, dtype=torch.float64)
        for c in range(r, chunks, dp):
            idx = (np.arange(micro) + c * micro) % n
            x, y = self.train_batches.to_device(self.val_windows.gather(idx))
            with self.precision.autocast():
                loss = lm_loss(self.model(x), y)
            totals += torch.stack([loss.double() * micro, torch.tensor(micro, device=x.device)])
        dist.all_reduce(totals, group=self.ctx.dp_group)
        self.model.train()
        return (totals[0] / totals[1]).item()

    # -- the loop -----------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg, plan = self.cfg, self.plan
        every, eval_every = cfg.logging.every, cfg.train.eval_every
        save_steps = set(plan.checkpoint.steps)
        save_every_s = 60.0 * plan.checkpoint.every_minutes
        tokens_per_step = plan.batch.tokens_per_step
        # [loss sum, "time to save" votes]: reduced together, only at logging steps
        window = torch.zeros(2, device=self.ctx.device)
        window_steps, window_start = 0, time.perf_counter()
        train_start, first_step = window_start, self.step + 1
        tokens_per_s: list[float] = []
        self.model.train()
        while self.step < plan.steps:
            log_now = (self.step + 1) % every == 0 or self.step + 1 == plan.steps
            loss, norm = self.train_step(want_norm=log_now)
            window[0] += loss
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
                dist.all_reduce(window, op=dist.ReduceOp.SUM, group=self.ctx.dp_group)
                self.last_loss = window[0].item() / (window_steps * plan.batch.dp)
                save_now = save_now or window[1].item() > 0
                elapsed = time.perf_counter() - window_start
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
                            "tokens_per_s": tps,
                            "step_time_ms": 1000 * elapsed / window_steps,
                        },
                    )
                window.zero_()
                window_steps, window_start = 0, time.perf_counter()
            if (eval_every and self.step % eval_every == 0) or self.step == plan.steps:
                self.last_val_loss = self.evaluate()
                if self.sink:
                    self.sink.log(self.step, {"val_loss": self.last_val_loss}, kind="val")
                window_start = time.perf_counter()  # keep validation out of tokens/s
            if save_now:
                self.save_checkpoint()
                window_start = time.perf_counter()
            self.checkpoints.poll()
            if self.sink:
                self.sink.advance(self.step)
        self.checkpoints.close()
        wall = time.perf_counter() - train_start
        return self._summary(wall, tokens_per_s)

    def replica_digests(self) -> list[str]:
        """sha256 of this rank's parameter bytes, gathered over the dp group: DDP replicas
        must hold bit-identical parameters (the check users run when they doubt the sync)."""
        h = hashlib.sha256()
        for p in self.params:
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        out: list[str | None] = [None] * self.plan.batch.dp
        dist.all_gather_object(out, h.hexdigest(), group=self.ctx.dp_group)
        return [str(d) for d in out]

    def _mark_first_step(self) -> None:
        self.times["first_step_done"] = time.time()
        t0 = float(os.environ.get("DTRAIN_LAUNCH_T0", "nan"))
        log.info("first step done %.2f s after launch", self.times["first_step_done"] - t0)

    def _summary(self, wall: float, tokens_per_s: list[float]) -> dict[str, Any]:
        t0 = float(os.environ.get("DTRAIN_LAUNCH_T0", "nan"))
        startup = {k: round(v - t0, 3) for k, v in self.times.items()}
        digests = self.replica_digests()
        summary = {
            "recipe": self.plan.recipe,
            "world_size": self.plan.world_size,
            "steps": self.step,
            "final_loss": self.last_loss,
            "val_loss": self.last_val_loss,
            "tokens_per_s": float(np.median(tokens_per_s)) if tokens_per_s else float("nan"),
            "train_wall_s": wall,
            "params": self.plan.estimates.num_params,
            "param_sum": float(sum(p.detach().double().sum() for p in self.params)),
            "param_sq_sum": float(sum(p.detach().double().square().sum() for p in self.params)),
            "param_digest": digests[0],
            "replicas_identical": len(set(digests)) == 1,
            "resumed_from": self.resumed_from,
            "checkpoint_stall_s": self.checkpoints.save_stall_s,
            **{f"startup_{k}_s": v for k, v in startup.items()},
        }
        if self.ctx.is_logging_rank:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            if self.sink:
                self.sink.console.print(summary_table(summary))
        return summary
