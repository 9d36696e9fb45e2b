"""Benchmarks 1a/1b: steady training speed of ``dtrain launch`` against the plain
torchrun + DDP loop on the same workload, and dtrain's fixed per-step cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness import (
    EN_DASH,
    Section,
    Workspace,
    interleaved,
    log,
    markdown_table,
    median,
    rounds_label,
    spread,
    used_rounds,
)
from programs import DtrainRun, Pair, Workload

TINY_MODEL = (
    "model.n_layer=1",
    "model.n_embd=16",
    "model.n_head=1",
    "model.block_size=32",
    "train.micro_batch_size=1",
    "train.global_batch_size=2",
)

CPU_NOTE = (
    "CPU seconds of each program's whole process tree (launcher/agent and both workers, "
    "all threads; `/proc/<pid>/task/*/schedstat`) between its log lines of the first and "
    "the last timed step, per step. Unlike wall time it hardly moves when other processes "
    "share the cores, so every round is used."
)


@dataclass
class Rounds:
    """Per-round measurements of both programs on one workload. Statistics use the rounds
    in which neither run was disturbed by other processes, when there are 2 or more."""

    work: Workload
    dtrain_ms: list[float] = field(default_factory=list)
    plain_ms: list[float] = field(default_factory=list)
    dtrain_self_ms: list[float] = field(default_factory=list)
    dtrain_self_tps: list[float] = field(default_factory=list)
    dtrain_param_sums: list[float] = field(default_factory=list)
    plain_param_sums: list[float] = field(default_factory=list)
    dtrain_cpu_ms: list[float] = field(default_factory=list)
    plain_cpu_ms: list[float] = field(default_factory=list)
    dtrain_clean: list[bool] = field(default_factory=list)
    plain_clean: list[bool] = field(default_factory=list)
    dtrain_first_s: list[float] = field(default_factory=list)
    """Command start to the end of optimizer step 1 (summary ``startup_first_step_done_s``)."""
    plain_first_s: list[float] = field(default_factory=list)
    tokens_per_step: int = 0
    commands: dict[str, str] = field(default_factory=dict)

    def add_dtrain(self, run: DtrainRun, clean: bool) -> None:
        w = self.work
        self.dtrain_ms.append(run.ms_per_step(w.timed_from, w.steps))
        self.dtrain_self_ms.append(run.self_reported_ms_per_step(w.timed_from))
        self.dtrain_self_tps.append(run.summary["tokens_per_s"])
        self.tokens_per_step = run.tokens_per_step
        self.dtrain_param_sums.append(run.summary["param_sum"])
        self.dtrain_cpu_ms.append(_per_step_ms(run.cpu_s, w))
        self.dtrain_clean.append(clean)
        self.dtrain_first_s.append(run.summary.get("startup_first_step_done_s", float("nan")))

    def add_plain(self, result: dict[str, Any], clean: bool) -> None:
        self.plain_ms.append(result["ms_per_step"])
        self.plain_param_sums.append(result["param_sum"])
        self.plain_cpu_ms.append(_per_step_ms(result["cpu_s"], self.work))
        self.plain_clean.append(clean)
        self.plain_first_s.append(result.get("first_step_done_s", float("nan")))

    def pick(self, values: list[float]) -> list[float]:
        return [values[i] for i in used_rounds(self.dtrain_clean, self.plain_clean)]

    def rounds_label(self) -> str:
        return rounds_label(self.dtrain_clean, self.plain_clean)

    def tps(self, ms: list[float]) -> list[float]:
        return [1000 * self.tokens_per_step / m for m in self.pick(ms)]

    def ratios(self) -> list[float]:
        """dtrain/plain tokens/s, round by round."""
        return self.pick([p / d for d, p in zip(self.dtrain_ms, self.plain_ms, strict=True)])

    def diffs_ms(self) -> list[float]:
        return self.pick([d - p for d, p in zip(self.dtrain_ms, self.plain_ms, strict=True)])

    def cpu_ratios(self) -> list[float]:
        """dtrain/plain CPU time per step, round by round (all rounds: CPU time is hardly
        moved by other processes)."""
        pairs = zip(self.dtrain_cpu_ms, self.plain_cpu_ms, strict=True)
        return [d / p for d, p in pairs]

    def cpu_diffs_ms(self) -> list[float]:
        return [d - p for d, p in zip(self.dtrain_cpu_ms, self.plain_cpu_ms, strict=True)]

    def same_params(self) -> str:
        pairs = zip(self.dtrain_param_sums, self.plain_param_sums, strict=True)
        worst = max(abs(d - p) / max(abs(p), 1e-12) for d, p in pairs)
        return "yes, bitwise" if worst == 0 else f"rel. diff {worst:.1e}"


def cpu_table(results: list[Rounds]) -> str:
    """The same rounds in CPU time per step, one row per workload."""
    headers = ["workload", "rounds", "dtrain CPU ms/step", "plain CPU ms/step"]
    rows = [
        [
            res.work.label,
            str(len(res.dtrain_cpu_ms)),
            spread(res.dtrain_cpu_ms, _fmt_ms),
            spread(res.plain_cpu_ms, _fmt_ms),
            spread([1 / r for r in res.cpu_ratios()], _fmt_ratio),
        ]
        for res in results
    ]
    return markdown_table([*headers, "plain CPU / dtrain CPU"], rows)


def _per_step_ms(cpu_s: float | None, work: Workload) -> float:
    return float("nan") if cpu_s is None else 1000 * cpu_s / work.timed_steps


def measure(ws: Workspace, work: Workload, rounds: int) -> Rounds:
    pair, out = Pair(ws, work), Rounds(work)
    for r, program in interleaved(rounds, ("dtrain", "plain")):
        if program == "dtrain":
            out.add_dtrain(pair.dtrain(), not ws.guard.last_disturbed)
        else:
            out.add_plain(pair.plain(), not ws.guard.last_disturbed)
        last = out.dtrain_ms if program == "dtrain" else out.plain_ms
        cpu = out.dtrain_cpu_ms if program == "dtrain" else out.plain_cpu_ms
        log(
            f"{work.label} round {r + 1}/{rounds} {program}: {last[-1]:.2f} ms/step, "
            f"{cpu[-1]:.2f} CPU ms/step"
        )
    out.commands = pair.commands
    return out


def _fmt_tps(x: float) -> str:
    return f"{x:,.0f}"


def _fmt_ms(x: float) -> str:
    return f"{x:.2f}"


def _fmt_ratio(x: float) -> str:
    return f"{x:.3f}"


def _commands(results: list[Rounds]) -> list[str]:
    return [
        f"# {res.work.label}, {prog}\n{cmd}"
        for res in results
        for prog, cmd in sorted(res.commands.items())
    ]


def _workloads(quick: bool) -> list[tuple[Workload, int]]:
    if quick:
        return [(Workload("gpt_tiny", "gpt_tiny", 20, 10, 10), 2)]
    return [
        (Workload("gpt_tiny", "gpt_tiny", 60, 10, 10), 5),
        (Workload("gpt_small", "gpt_small", 10, 2, 2), 3),
    ]


def framework_overhead(ws: Workspace) -> Section:
    results = [measure(ws, work, rounds) for work, rounds in _workloads(ws.quick)]
    rows = []
    for res in results:
        w = res.work
        rows.append(
            [
                w.label,
                f"{w.timed_from + 1}{EN_DASH}{w.steps} of {w.steps}",
                res.rounds_label(),
                spread(res.tps(res.dtrain_ms), _fmt_tps),
                spread(res.tps(res.plain_ms), _fmt_tps),
                spread(res.ratios(), _fmt_ratio),
                "≥ 0.98",
                spread(res.pick(res.dtrain_self_tps), _fmt_tps),
                res.same_params(),
            ]
        )
    headers = [
        "workload",
        "timed steps",
        "rounds used",
        "dtrain tokens/s",
        "plain tokens/s",
        "dtrain / plain",
        "target",
        "dtrain's own summary tokens_per_s",
        "same final params",
    ]
    return Section(
        title="1. Framework overhead: steady tokens/s, `dtrain launch dp=2` vs torchrun + DDP",
        what=(
            "Same model class, data stream, global batch, AdamW settings, LR schedule, grad "
            "clipping, DDP options and 1 thread per process on both sides "
            "(`bench/plain_ddp.py`). Tokens/s over the timed steps only (warm-up steps "
            "excluded): for dtrain from the `time` stamps of its metrics.jsonl records "
            "(so its logging costs count), for plain from `time.perf_counter` in the loop. "
            f"Cells are median (min{EN_DASH}max) over the rounds used (rounds in which another "
            "process took CPU time are left out when 2 or more clean ones remain); the ratio "
            "is taken round by round."
        ),
        table=markdown_table(headers, rows)
        + "\n\nThe same runs in CPU time: "
        + CPU_NOTE
        + "\n\n"
        + cpu_table(results),
        commands=_commands(results),
        notes=[
            "\"same final params\": dtrain's summary `param_sum` against the plain script's "
            "sum of all parameters after the last step, every round.",
            '"dtrain\'s own summary tokens_per_s" is the median of its logging windows after '
            "the first; it leaves out the time spent writing each log record.",
        ],
    )


def fixed_cost(ws: Workspace) -> Section:
    steps, every, rounds = (100, 50, 2) if ws.quick else (2000, 50, 9)
    work = Workload("fixed", "gpt_tiny", steps, every, every, TINY_MODEL)
    res = measure(ws, work, rounds)
    row = [
        f"{work.timed_from + 1}{EN_DASH}{steps} of {steps}",
        res.rounds_label(),
        spread(res.pick(res.dtrain_ms), _fmt_ms),
        spread(res.pick(res.plain_ms), _fmt_ms),
        spread(res.diffs_ms(), lambda x: f"{x:+.2f}"),
        f"{median(res.pick(res.dtrain_ms)) - median(res.pick(res.plain_ms)):+.2f}",
        "≤ +0.30",
        spread(res.pick(res.dtrain_self_ms), _fmt_ms),
        res.same_params(),
    ]
    headers = [
        "timed steps",
        "rounds used",
        "dtrain ms/step",
        "plain ms/step",
        "dtrain - plain, per round",
        "difference of medians",
        "target (ms)",
        "dtrain's own step_time_ms",
        "same final params",
    ]
    cpu_row = [
        str(len(res.dtrain_cpu_ms)),
        spread(res.dtrain_cpu_ms, _fmt_ms),
        spread(res.plain_cpu_ms, _fmt_ms),
        spread(res.cpu_diffs_ms(), lambda x: f"{x:+.2f}"),
        spread([d / 2 for d in res.cpu_diffs_ms()], lambda x: f"{x:+.2f}"),
    ]
    cpu_headers = [
        "rounds",
        "dtrain CPU ms/step",
        "plain CPU ms/step",
        "dtrain - plain, per round",
        "the same per rank (/2)",
    ]
    return Section(
        title="1b. Fixed per-step cost: a 1-layer width-16 GPT, micro-batch 1, 2 ranks",
        what=(
            "A model so small that a step is almost all fixed cost (Python, autograd, DDP, "
            f"optimizer), so what dtrain's loop adds shows up: `{' '.join(TINY_MODEL)}`, "
            f"`logging.every={every}` (a user's setting, logging amortized). dtrain's ms/step "
            "from the metrics.jsonl `time` stamps of the windows after the first; plain's "
            "from `time.perf_counter` over the same step range."
        ),
        table=markdown_table(headers, [row])
        + "\n\nThe same runs in CPU time: "
        + CPU_NOTE
        + "\n\n"
        + markdown_table(cpu_headers, [cpu_row]),
        commands=_commands([res]),
    )
