"""The loop's metrics component: the window of steps between logging steps, the one small
all-reduce of a logging step, tokens/s, busy time, and what goes to ``metrics.jsonl``.

    dtrain launch recipe=gpt_tiny logging.every=10

Per step only host timers run and the step's loss tensor is kept (no host sync). At a
logging step one all-reduce over WORLD carries ``[loss sum, save votes, stop votes]``,
then three slots per rank (each rank fills its own: time per step, data wait, compute =
step - data wait - exposed DDP communication) and what other components add
(:meth:`TrainMetrics.log_step`); the loss sum comes from the ranks whose loss counts once
per dp replica (last pipeline stage, tp rank 0). Stragglers: a rank whose own time
(compute + data wait) is above ``debug.straggler_factor`` x the median is named in the
log and in ``metrics.jsonl`` (``stragglers``); ``summary.json`` has per-rank medians.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dtrain_cli.config.site_schema import HardwareConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.plan.steptime import peak_flops
from dtrain_cli.runtime.components.sinks import MetricsSink
from dtrain_cli.runtime.diagnostics.watchdog import COLLECTIVES
from dtrain_cli.runtime.parallel.mesh import DistContext

log = logging.getLogger("dtrain")

NUM_VOTES = 3  # loss sum, save votes, stop votes
RANK_SLOTS = ("step_ms", "data_ms", "compute_ms")


def find_stragglers(own_ms: list[float], factor: float, min_gap_ms: float = 1.0) -> list[int]:
    """Ranks whose own time per step is above ``factor`` x the median of the other ranks'
    (and above it by more than ``min_gap_ms``, so that tiny steps do not name noise)."""
    out = []
    for r, value in enumerate(own_ms):
        others = own_ms[:r] + own_ms[r + 1 :]
        if not others:
            continue
        median = float(np.median(others))
        if value > factor * median and value - median > min_gap_ms:
            out.append(r)
    return out


@dataclass
class Reduced:
    """What every rank learned at a logging step (the same on every rank)."""

    loss: float
    save: bool
    stop: bool
    extra: list[float]


class TrainMetrics:
    def __init__(
        self,
        *,
        plan: Plan,
        ctx: DistContext,
        every: int,
        start_step: int,
        reports_loss: bool,
        sink: MetricsSink | None,
        step_times: Callable[[], dict[str, float]],
        batches: Any,
        straggler_factor: float,
        rank_times: bool = True,
        norm_mean_over_replicas: bool = False,
    ) -> None:
        """``norm_mean_over_replicas``: replicas step on gradients of their own (local SGD,
        DiLoCo, an asynchronous parameter server), so grad_norm is the mean of their norms
        (one more slot of the logging all-reduce); otherwise every replica holds the same."""
        self.plan, self.ctx, self.every, self.sink = plan, ctx, every, sink
        self.reports_loss, self.step_times = reports_loss, step_times
        self.batches, self.straggler_factor = batches, straggler_factor
        self.rank_times = rank_times
        self.norm_mean_over_replicas = norm_mean_over_replicas
        self._wait0 = 0.0
        self.rank_rows: list[list[float]] = []  # per logging step: 3 values per rank
        self.straggler_counts: dict[int, int] = {}
        self.slow_before: set[int] = set()  # above the factor in the window before
        self.ranks_before = 0
        self.last_window: list[torch.Tensor] = []
        self.first_step = start_step + 1
        self.losses: list[torch.Tensor] = []
        self.window_steps = self.loss_steps = 0
        self.carried_loss = 0.0
        """A resume between logging steps: the open window's steps before the checkpoint
        (their global mean losses summed), which this window's loss goes on from."""
        self.window_first = start_step + 1  # the open window's first step
        self.train_start = self.window_start = time.perf_counter()
        self.tokens_per_s: list[float] = []  # per window after the warm-up one
        # the warm-up window without its first step: the rate when no other window exists
        self._after_warmup: tuple[float, int] | None = None  # (clock, steps since)
        self.warmup_window_tps: float | None = None
        self.busy_s = self.step_wall_s = 0.0
        self.last_loss: float | None = None  # until the first logging window
        self.last_loss_steps = 0
        """Steps the last window's loss counts: 0 when the numerics policy skipped them all."""
        self._wall0 = self._cpu0 = 0.0
        self.measures_bubble = plan.pipeline is not None and ctx.device.type == "cpu"
        """A pipeline's idle share from CPU busy vs wall time per step (:meth:`bubble_report`);
        ``process_time`` is a system call, so other runs do not pay it every step."""

    def is_logging_step(self, step: int) -> bool:
        """``step``: the number of steps done once the step about to run completes."""
        return step % self.every == 0 or step == self.plan.steps

    # -- per step: host timers only ---------------------------------------------------------
    def step_begins(self) -> None:
        if self.measures_bubble:
            self._wall0, self._cpu0 = time.perf_counter(), time.process_time()

    def step_ends(self, step: int, loss: torch.Tensor | None) -> None:
        """``loss`` None: a skipped step (numerics policy), not in the logged loss."""
        if self.measures_bubble and step > self.first_step:  # after the warm-up step
            self.busy_s += time.process_time() - self._cpu0
            self.step_wall_s += time.perf_counter() - self._wall0
        if loss is not None:
            self.losses.append(loss)
            self.loss_steps += 1
        self.window_steps += 1
        if step == self.first_step:
            self._after_warmup = (time.perf_counter(), 0)
        elif self._after_warmup is not None:
            self._after_warmup = (self._after_warmup[0], self._after_warmup[1] + 1)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Validation or a save: its time is kept out of tokens/s and ms per step, and the
        window's steps before it still count (restarting the clock there divided the whole
        window's tokens by the steps after the save: 5x the rate, a fifth of the ms/step)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            gap = time.perf_counter() - start
            self.window_start += gap
            if self._after_warmup is not None:
                clock, steps = self._after_warmup
                self._after_warmup = (clock + gap, steps)

    def own_times(self, comm_exposed_ms: float) -> list[float]:
        """This rank's [step, data wait, compute] ms per step over the window."""
        n = max(1, self.window_steps)
        step_ms = 1000 * (time.perf_counter() - self.window_start) / n
        data_ms = 1000 * (self.batches.wait_s - self._wait0) / n
        return [step_ms, data_ms, max(0.0, step_ms - data_ms - comm_exposed_ms)]

    # -- logging steps ---------------------------------------------------------------------
    def log_step(
        self,
        step: int,
        norm: torch.Tensor | None,
        save_vote: bool,
        stop_vote: bool,
        extra: list[float] | None = None,
        lr_steps: int | None = None,
    ) -> Reduced:
        """The logging step's one all-reduce (SUM over WORLD): the loss, the votes, and
        ``extra`` slots other components fill (each rank its own slots, zeros elsewhere).
        ``lr_steps``: the schedule steps taken (fewer than ``step`` after a skipped step),
        so the logged lr is the one the last step used."""
        extra = extra or []
        comm = self.step_times()  # the strategy's own timings (DDP's), if any
        slots = self.rank_slots(comm)
        norm_slot = []
        if self.norm_mean_over_replicas:
            norm_slot = [float(norm) if norm is not None and self.reports_loss else 0.0]
        values = self.all_reduce_window(step, save_vote, stop_vote, [*slots, *extra, *norm_slot])
        if norm_slot:
            norm = torch.tensor(values.pop() / self.plan.batch.dp)
        loss_sum, save_votes, stop_votes = values[:NUM_VOTES]
        ranks = values[NUM_VOTES : NUM_VOTES + len(slots)]
        loss = loss_sum / (self.loss_steps * self.plan.batch.dp) if self.loss_steps else math.nan
        self.last_loss = loss
        stragglers = self.note_ranks(step, ranks) if self.rank_times else []
        k = len(RANK_SLOTS)
        per_rank = {f"rank_{n}": ranks[i::k] for i, n in enumerate(RANK_SLOTS)} if ranks else {}
        loss_steps = self.last_loss_steps = self.loss_steps
        tps, data_wait_ms = self.close_window(step)
        if self.sink:
            self.sink.log(
                step,
                {
                    "loss": loss,  # the mean over the window's counted steps
                    "loss_steps": loss_steps,
                    "lr": self.plan.lr.lr_at((step if lr_steps is None else lr_steps) - 1),
                    "grad_norm": float(norm) if norm is not None else float("nan"),
                    f"{self.plan.batch.unit}_per_s": tps,
                    "step_time_ms": self.step_ms,
                    "data_wait_ms": data_wait_ms,  # this rank's, per step of the window
                    **comm,
                    **per_rank,
                    **({"stragglers": stragglers} if self.rank_times else {}),
                },
            )
        return Reduced(
            loss,
            save_votes > 0,
            stop_votes > 0 and step < self.plan.steps,
            values[NUM_VOTES + len(slots) :],
        )

    def rank_slots(self, comm: dict[str, float]) -> list[float]:
        """Three slots per rank, this rank's own filled (:data:`RANK_SLOTS`); none when
        per-rank times are off."""
        k = len(RANK_SLOTS)
        slots = [0.0] * (k * self.ctx.world_size if self.rank_times else 0)
        if self.rank_times:
            r = self.ctx.rank
            slots[k * r : k * r + k] = self.own_times(comm.get("comm_exposed_ms", 0.0))
        return slots

    # -- a checkpoint between logging steps keeps the open window --------------------------
    def window_state(self) -> dict[str, torch.Tensor]:
        """The open window for a checkpoint (one all-reduce, the same on every rank; empty
        at a logging step): a resume from it logged the window's later steps alone (the
        loss of steps 6-10 as step 10's, 6.6e-2 off the run that never stopped)."""
        if not self.window_steps:
            return {}
        total = torch.zeros(1, dtype=torch.float64, device=self.ctx.device)
        if self.reports_loss and self.losses:
            total[0] = torch.stack(self.losses).sum().double()
        dist.all_reduce(total)
        mean_sum = float(total[0]) / self.plan.batch.dp + self.carried_loss
        return {
            "window.loss_mean_sum": torch.tensor(mean_sum, dtype=torch.float64),
            "window.loss_steps": torch.tensor(self.loss_steps),
            "window.first_step": torch.tensor(self.window_first),
        }

    def carry(self, state: dict[str, torch.Tensor]) -> None:
        """Go on with a checkpoint's open window (:meth:`window_state`), at any layout; not
        when ``logging.every`` changed so that a window starts elsewhere (the next loss is
        then of the steps after the resume, as a run logging so from the start has it)."""
        first = int(state.get("window.first_step", torch.tensor(-1)))
        if "window.loss_steps" in state and (first - 1) % self.every == 0:
            self.loss_steps = int(state["window.loss_steps"])
            self.carried_loss = float(state["window.loss_mean_sum"])
            self.window_first = first

    def all_reduce_window(
        self, step: int, save_vote: bool, stop_vote: bool, slots: list[float]
    ) -> list[float]:
        """``[loss sum, save votes, stop votes, *slots]`` summed over all ranks (see
        ``reports_loss``): the logging step's one collective and its one host read."""
        window = torch.zeros(NUM_VOTES + len(slots), device=self.ctx.device)
        if self.reports_loss and self.losses:
            window[0] = torch.stack(self.losses).sum()
        if self.carried_loss and self.ctx.rank == 0:  # counted once, as dp replicas sum
            window[0] += self.carried_loss * self.plan.batch.dp
        window[1], window[2] = float(save_vote), float(stop_vote)
        window[NUM_VOTES:] = torch.tensor(slots, device=self.ctx.device)
        with COLLECTIVES.enter("all_reduce", step, "logging"):
            dist.all_reduce(window, op=dist.ReduceOp.SUM)
        return window.tolist()

    def close_window(self, step: int) -> tuple[float, float]:
        """The window's tokens/s and data wait (ms per step), kept for the summary with its
        ms per step; the next window starts now."""
        now = time.perf_counter()
        elapsed = now - self.window_start  # the record written after counts in the next window
        tps = self.plan.batch.tokens_per_step * self.window_steps / elapsed
        if step - self.window_steps >= self.first_step:  # first window: warm-up costs
            self.tokens_per_s.append(tps)
        elif self._after_warmup is not None:
            clock, steps_after = self._after_warmup
            if steps_after and now > clock:
                rate = self.plan.batch.tokens_per_step * steps_after / (now - clock)
                self.warmup_window_tps = rate
            self._after_warmup = None
        self.step_ms = 1000 * elapsed / self.window_steps
        data_wait_ms = 1000 * (self.batches.wait_s - self._wait0) / self.window_steps
        self.last_window = list(self.losses)
        self.losses.clear()
        self.window_steps, self.loss_steps, self.window_start = 0, 0, now
        self.carried_loss, self.window_first = 0.0, step + 1
        self._wait0 = self.batches.wait_s
        return tps, data_wait_ms

    def note_ranks(self, step: int, ranks: list[float]) -> list[int]:
        """Per-rank times of this window (the same on every rank): stragglers named."""
        k = len(RANK_SLOTS)
        if step - self.window_steps >= self.first_step:  # not the warm-up window
            self.rank_rows.append(ranks)
        own = [ranks[i * k + 1] + ranks[i * k + 2] for i in range(len(ranks) // k)]
        # named when slow in two windows running: a rank's own time subtracts the exposed
        # communication of DDP's one sampled step, so one window can be off (a save's
        # background write, a short last window); a straggler stays slow
        slow_now = find_stragglers(own, self.straggler_factor)
        if len(own) != self.ranks_before:  # an elastic change: other ranks now
            self.slow_before, self.ranks_before = set(), len(own)
        slow = [r for r in slow_now if r in self.slow_before]
        self.slow_before = set(slow_now)
        for r in slow:
            median = float(np.median(own[:r] + own[r + 1 :]))
            self.straggler_counts[r] = self.straggler_counts.get(r, 0) + 1
            log.warning(
                "straggler at step %d: rank %d takes %.1f ms/step of its own (compute %.1f, "
                "data wait %.1f) vs the others' median %.1f (x%.1f; debug.straggler_factor=%g)",
                step,
                r,
                own[r],
                ranks[r * k + 2],
                ranks[r * k + 1],
                median,
                own[r] / median if median else float("inf"),
                self.straggler_factor,
            )
        return slow

    def rank_summary(self) -> dict[str, Any]:
        """Per-rank medians over the logging windows after the warm-up."""
        if not self.rank_rows:
            return {}
        rows = np.array(self.rank_rows)
        k = len(RANK_SLOTS)
        out: dict[str, Any] = {
            f"rank_{name}_median": [round(float(v), 3) for v in np.median(rows[:, i::k], axis=0)]
            for i, name in enumerate(RANK_SLOTS)
        }
        out["stragglers"] = {str(r): n for r, n in sorted(self.straggler_counts.items())}
        return out

    def log(self, step: int, values: dict[str, float], kind: str) -> None:
        if self.sink:
            self.sink.log(step, values, kind=kind)

    # -- the summary -------------------------------------------------------------------------
    def median_tokens_per_s(self) -> float | None:
        """The median over the windows after the warm-up one; with no such window (one
        logging window: the last step), the warm-up window's rate without its first step;
        None when nothing but the first step ran."""
        if self.tokens_per_s:
            return float(np.median(self.tokens_per_s))
        return self.warmup_window_tps

    def measured_mfu(self, hw: HardwareConfig) -> float | None:
        """The steady rate's model FLOPs over the world's peak on ``hw`` (the plan's FLOPs
        per token, no recomputation: MFU as published); None without a rate, or where the
        profile is not this run's device (the default CPU profile under a CUDA run)."""
        rate = self.median_tokens_per_s()
        low = self.plan.precision.name in ("bf16", "fp16")
        peak = peak_flops(hw, low) * max(self.plan.world_size, 1)
        if not rate or hw.device != self.plan.device or peak <= 0:
            return None
        return self.plan.estimates.flops_per_token * rate / peak

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
