"""The metric sinks of the logging rank: ``metrics.jsonl``, TensorBoard, progress, summary.

Metrics go to ``metrics.jsonl`` and TensorBoard
(``<run>/tb``) from rank 0 only, and only at logging steps: nothing here runs per step
except :meth:`MetricsSink.advance`, which touches the progress bar at most 4 times a second.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dtrain_cli.rundir import strict_json
from dtrain_cli.rundir.layout import RunDir

log = logging.getLogger("dtrain")


class MetricsSink:
    """metrics.jsonl + TensorBoard + progress, on the logging rank."""

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        start_step: int,
        mode: str,
        tensorboard: bool,
        console: Console,
    ) -> None:
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.start_step = start_step
        self.jsonl = open(RunDir(run_dir).metrics, "a", buffering=1)  # noqa: SIM115
        self.tensorboard = tensorboard
        self._writer: Any = None
        self.console = console
        if mode == "auto":
            mode = "bar" if console.is_terminal else "lines"
        self.mode = mode
        self.progress: Progress | None = None
        self._task = None
        self._last_refresh = 0.0
        self._fields: dict[str, str] = {"loss": "-", "lr": "-", "tps": "-"}
        if mode == "bar":
            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[tps]}"),
                TimeRemainingColumn(),
                console=console,
                auto_refresh=False,
            )
            self.progress.start()
            self._task = self.progress.add_task(
                "train", total=total_steps, completed=start_step, **self._fields
            )

    @property
    def writer(self) -> Any:
        if self._writer is None and self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported at first log, not at start

            # purge_step: events after a resumed step are dropped, so curves never double back
            self._writer = SummaryWriter(
                log_dir=str(RunDir(self.run_dir).tensorboard),
                purge_step=self.start_step + 1 if self.start_step else None,
            )
        return self._writer

    def advance(self, step: int) -> None:
        """Called every step with the number of completed steps; cheap."""
        if self.progress is None:
            return
        now = time.monotonic()
        if now - self._last_refresh >= 0.25:
            self.progress.update(self._task, completed=step, **self._fields)
            self.progress.refresh()
            self._last_refresh = now

    def log(self, step: int, values: dict[str, float], kind: str = "train") -> None:
        record = {"step": step, "kind": kind, "time": time.time(), **values}
        self.jsonl.write(strict_json.dumps(record) + "\n")  # a NaN loss: null, as JSON has
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):  # per-rank lists: metrics.jsonl only
                    self.writer.add_scalar(f"{kind}/{key}", value, step)
        if kind == "train":
            rate = throughput(values)  # tokens/s for language models, samples/s otherwise
            self._fields = {
                "loss": f"{values['loss']:.4f}",
                "lr": f"{values['lr']:.2e}",
                "tps": rate,
            }
            if self.progress is not None:
                self.progress.update(self._task, completed=step, **self._fields)
                self.progress.refresh()
            log.info(  # the rank's file always; the console when the mode is lines
                "step %d/%s  loss %.4f  lr %.3e  grad_norm %.3f  %s  %.1f ms/step",
                step,
                self.total_steps,
                values["loss"],
                values["lr"],
                values.get("grad_norm", float("nan")),
                rate,
                values["step_time_ms"],
                extra={"console": self.mode == "lines"},
            )
        else:
            log.info(
                "step %d  %s",
                step,
                "  ".join(f"{k} {v:.4f}" for k, v in values.items() if isinstance(v, (int, float))),
                extra={"console": self.mode != "off"},
            )

    def print_summary(self, summary: dict[str, Any], run_dir: Path) -> None:
        """End of the run: the progress bar's last line first, then the short summary."""
        if self.progress is not None:
            self.progress.update(self._task, completed=summary.get("steps"), **self._fields)
            self.progress.stop()
            self.progress = None
        self.console.print(summary_table(summary))
        for line in summary_lines(run_dir):
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        if self._writer is not None:
            self._writer.close()
        self.jsonl.close()


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """``summary.json``: strict JSON (a value not measured is null, never NaN)."""
    text = strict_json.dumps(summary, indent=2)
    RunDir(run_dir).summary.write_text(text)


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records after ``step`` (a resume continues from there: no duplicate steps)."""
    if not path.exists():
        return
    keep = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= step
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in keep))
    os.replace(tmp, path)


def throughput(values: dict[str, Any]) -> str:
    """``12,345 tok/s`` or ``1,234 samples/s``: the unit follows the model."""
    if "samples_per_s" in values:
        return f"{_num(values['samples_per_s'], ',.0f')} samples/s"
    return f"{_num(values.get('tokens_per_s'), ',.0f')} tok/s"


def _num(value: Any, fmt: str = ",.4f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def _rate(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return format(value, ",.0f")
    return "not measured (only the first step ran)"


def summary_table(summary: dict[str, Any]) -> Table:
    """What a person reads at the end of a run (summary.json keeps every field)."""
    table = Table(title="run summary", show_header=False, title_justify="left")
    table.add_row("steps", f"{summary.get('steps')} (world size {summary.get('world_size')})")
    table.add_row("final loss", _num(summary.get("final_loss")))
    table.add_row("val loss", _num(summary.get("val_loss")))
    # the median of the logging windows after the first, saves and validation left out:
    # what the layout sustains, not the run's average (a compile's first window is slow)
    if "samples_per_s" in summary:
        table.add_row("samples/s (steady median)", _rate(summary.get("samples_per_s")))
    else:
        table.add_row("tokens/s (steady median)", _rate(summary.get("tokens_per_s")))
    if isinstance(mfu := summary.get("mfu"), (int, float)):  # against the plan's estimate
        table.add_row("MFU (measured)", f"{mfu:.0%} of the hardware profile's peak")
    if isinstance(theory := summary.get("bubble_theory"), (int, float)):  # a pipeline's
        measured = summary.get("bubble_measured")
        said = f"{measured:.0%} measured, " if isinstance(measured, (int, float)) else ""
        table.add_row("pipeline bubble", f"{said}{theory:.0%} in theory (the plan's)")
    wall = f"{_num(summary.get('train_wall_s'), ',.1f')} s"
    startup = summary.get("startup_first_step_done_s")
    if isinstance(startup, (int, float)):
        wall += f" (launch to the end of step 1: {startup:,.1f} s)"
    if len(sizes := summary.get("memberships") or []) > 1:  # elastic: the whole run
        ran = " -> ".join(str(m["world_size"]) for m in sizes)
        last = _num(summary.get("train_wall_s_last_membership"), ",.1f")
        wall += f" (at {ran} processes; the last {last} s)"
    table.add_row("training time", wall)
    if summary.get("resumed_from"):
        table.add_row("resumed from", str(summary["resumed_from"]))
    if summary.get("replicas_identical") is False:
        table.add_row("[red]replicas[/]", "[red]dp replicas hold different parameters[/]")
    numerics = {k: v for k, v in (summary.get("numerics") or {}).items() if k != "events" and v}
    if numerics:
        table.add_row("[yellow]numerics[/]", ", ".join(f"{k} {v}" for k, v in numerics.items()))
    if summary.get("stragglers"):
        slow = ", ".join(f"rank {r} ({n}x)" for r, n in summary["stragglers"].items())
        table.add_row("[yellow]stragglers[/]", f"{slow}; see dtrain report")
    return table


def summary_lines(run_dir: Path) -> list[str]:
    """Below the table, unwrapped (a path to copy): the run dir and what it holds."""
    run = RunDir(run_dir)
    held = (run.summary, run.metrics, run.tensorboard, run.checkpoints, run.profile, run.logs)
    files = " ".join(p.name + ("/" if p.is_dir() else "") for p in held if p.exists())
    return [f"run dir: {run_dir}", f"  files: {files}"]


# (phase, milestone it ends at), in order; a phase whose milestones are missing (a worker
# started by srun has no agent milestones) is left out
STARTUP_PHASES = (
    ("compose", "composed"),  # interpreter start, CLI imports, Hydra compose, plan
    ("agent", "agent_ready"),  # torch + the runtime imported, run dir, data prepared
    ("rendezvous+start", "worker_start"),  # c10d rendezvous, workers forked
    ("process_group", "process_group_ready"),
    ("model+data+optim", "model_ready"),
    ("step_1", "first_step_done"),
)


def startup_phases(times: dict[str, float], t0: float) -> dict[str, float]:
    """Seconds spent in each start-up phase, from the launch command (``t0``) on."""
    out: dict[str, float] = {}
    previous = t0
    for phase, milestone in STARTUP_PHASES:
        if milestone in times:
            out[phase] = times[milestone] - previous
            previous = times[milestone]
    return out
