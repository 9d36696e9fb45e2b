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
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.data import BatchLayout, SampleStream, TokenWindows, open_splits
from dtrain_cli.runtime.distributed import DistContext
from dtrain_cli.runtime.metrics import MetricsSink, summary_table
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
        sink: MetricsSink | None,
    ) -> None:
        self.cfg, self.plan, self.ctx, self.run_dir, self.sink = cfg, plan, ctx, run_dir, sink
        self.times: dict[str, float] = {}
        torch.manual_seed(cfg.train.seed + ctx.rank)  # dropout differs per rank, init does not
        splits = open_splits(cfg.data, cfg.model, cfg.train.seed)
        layout = BatchLayout(
            plan.batch.micro_batch_size, plan.batch.grad_accum, plan.batch.dp, ctx.dp_rank
        )
        self.train_batches = Batches(splits["train"], layout, cfg.train.seed, ctx.device)
        self.val_windows = splits["val"]
        model = build_model(cfg.model, cfg.train.seed, ctx.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.model = parallelize(model, cfg, ctx)
        self.optimizer = build_optimizer(model, cfg.optim, plan.lr.peak_lr)
        self.scheduler = build_scheduler(self.optimizer, plan.lr)
        self.precision = Precision(plan.precision, cfg.precision, ctx.device)
        self.step = 0
        self.last_val_loss: float | None = None

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
        tokens_per_step = plan.batch.tokens_per_step
        window_loss = torch.zeros((), device=self.ctx.device)
        window_steps, window_start = 0, time.perf_counter()
        train_start = window_start
        tokens_per_s: list[float] = []
        last_loss = float("nan")
        self.model.train()
        while self.step < plan.steps:
            log_now = (self.step + 1) % every == 0 or self.step + 1 == plan.steps
            loss, norm = self.train_step(want_norm=log_now)
            window_loss += loss
            window_steps += 1
            self.step += 1
            if self.step == 1:
                self._mark_first_step()
            if log_now:
                dist.all_reduce(window_loss, op=dist.ReduceOp.SUM, group=self.ctx.dp_group)
                last_loss = window_loss.item() / (window_steps * plan.batch.dp)
                elapsed = time.perf_counter() - window_start
                tps = tokens_per_step * window_steps / elapsed
                if self.step > window_steps:  # the first window includes warm-up costs
                    tokens_per_s.append(tps)
                if self.sink:
                    self.sink.log(
                        self.step,
                        {
                            "loss": last_loss,
                            "lr": self.plan.lr.lr_at(self.step - 1),
                            "grad_norm": float(norm) if norm is not None else float("nan"),
                            "tokens_per_s": tps,
                            "step_time_ms": 1000 * elapsed / window_steps,
                        },
                    )
                window_loss.zero_()
                window_steps, window_start = 0, time.perf_counter()
            if (eval_every and self.step % eval_every == 0) or self.step == plan.steps:
                self.last_val_loss = self.evaluate()
                if self.sink:
                    self.sink.log(self.step, {"val_loss": self.last_val_loss}, kind="val")
                window_start = time.perf_counter()  # keep validation out of tokens/s
            if self.sink:
                self.sink.advance(self.step)
        wall = time.perf_counter() - train_start
        return self._summary(last_loss, wall, tokens_per_s)

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

    def _summary(self, loss: float, wall: float, tokens_per_s: list[float]) -> dict[str, Any]:
        t0 = float(os.environ.get("DTRAIN_LAUNCH_T0", "nan"))
        startup = {k: round(v - t0, 3) for k, v in self.times.items()}
        digests = self.replica_digests()
        summary = {
            "recipe": self.plan.recipe,
            "world_size": self.plan.world_size,
            "steps": self.step,
            "final_loss": loss,
            "val_loss": self.last_val_loss,
            "tokens_per_s": float(np.median(tokens_per_s)) if tokens_per_s else float("nan"),
            "train_wall_s": wall,
            "params": self.plan.estimates.num_params,
            "param_sum": float(sum(p.detach().double().sum() for p in self.params)),
            "param_sq_sum": float(sum(p.detach().double().square().sum() for p in self.params)),
            "replicas_identical": len(set(digests)) == 1,
            **{f"startup_{k}_s": v for k, v in startup.items()},
        }
        if self.ctx.is_logging_rank:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            if self.sink:
                self.sink.console.print(summary_table(summary))
        return summary
