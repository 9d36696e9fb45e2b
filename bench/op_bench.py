"""Benchmark ``ops``: the work one logging-free step does, counted, dtrain against the plain
loop (the same four workloads as sections 1, 1b, HF and Custom).

    .venv/bin/python bench/run.py --only ops

Wall and CPU time per step move with this machine's speed by more than the gap the
targets ask about (steady tokens/s >= 0.98 x plain; a fixed cost of which none is in
logging-free steps). What a step *does* does not: both programs take a torch.profiler
trace of the same steps (dtrain ``debug.profile_steps=[A,B]``, the plain loop
``--profile-steps A B``; CPU activity, rank 0), steps that log nothing under either, and
the operators each ran are counted. ``aten::_local_scalar_dense`` is a tensor read by the
host (``.item()``, ``float(t)``), which waits for the device when the tensor is on a GPU.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from harness import Section, Workspace, log, markdown_table
from model_bench import OWN_MODEL
from programs import Pair, Workload, run_plain
from throughput import TINY_MODEL

FIRST, LAST = 12, 14  # 1-based; logging every 10 steps: neither program logs in these
HOST_READ = "aten::_local_scalar_dense"

WORKLOADS = (
    ("gpt_tiny (section 1)", "gpt_tiny", ()),
    ("1-layer width-16 GPT, micro-batch 1 (section 1b)", "gpt_tiny", TINY_MODEL),
    ("llama_tiny_hf (HF)", "llama_tiny_hf", ()),
    ("own_lm (Custom)", "own_lm", ("--config-dir", str(OWN_MODEL))),
)

HEADERS = [
    "workload",
    "dtrain ops/step",
    "plain ops/step",
    "dtrain - plain",
    "host reads/step, dtrain; plain",
    "operators dtrain runs more of (per step)",
    "operators dtrain runs fewer of (per step)",
]


def op_counts(trace: Path) -> Counter[str]:
    """Operators (``cpu_op`` events) in a chrome trace, by name."""
    events = json.loads(trace.read_text())["traceEvents"]
    return Counter(e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op")


def _listed(diff: dict[str, float], names: list[str], most: int) -> str:
    shown = ", ".join(f"{k} {diff[k]:+g}" for k in names[:most])
    return (shown + (f" and {len(names) - most} more" if len(names) > most else "")) or "none"


def compare(label: str, dtrain: Counter[str], plain: Counter[str]) -> list[str]:
    steps = LAST - FIRST + 1
    d, p = sum(dtrain.values()) / steps, sum(plain.values()) / steps
    diff = {k: (dtrain[k] - plain[k]) / steps for k in dtrain.keys() | plain.keys()}
    order = sorted(diff, key=lambda k: (-abs(diff[k]), k))
    more = [k for k in order if diff[k] > 0]
    fewer = [k for k in order if diff[k] < 0]
    reads = f"{dtrain[HOST_READ] / steps:g}; {plain[HOST_READ] / steps:g}"
    row = [label, f"{d:,.0f}", f"{p:,.0f}", f"{d - p:+,.1f}", reads]
    return [*row, _listed(diff, more, 8), _listed(diff, fewer, 4)]


def measure(
    ws: Workspace, label: str, recipe: str, overrides: tuple[str, ...]
) -> tuple[list[str], dict[str, str]]:
    """One dtrain launch and one plain run of the workload, each profiling the same steps."""
    profile = (f"debug.profile_steps=[{FIRST},{LAST}]",)
    work = Workload(recipe, recipe, LAST + 2, 10, 10, (*overrides, *profile))
    pair = Pair(ws, work)
    run = pair.dtrain()
    plain_dir = ws.root / ws.next_name("ops-plain")
    assert pair.plain_args is not None
    flags = ["--profile-steps", str(FIRST), str(LAST), "--profile-out", str(plain_dir)]
    cmd, _ = run_plain(ws, work, [*pair.plain_args, *flags])
    pair.commands["plain"] = cmd.shown(ws)
    dtrain_trace = run.run_dir / "profile" / "rank_0.trace.json"
    plain_trace = plain_dir / "profile" / "rank_0.trace.json"  # dtrain's profiler, both
    row = compare(label, op_counts(dtrain_trace), op_counts(plain_trace))
    log(f"ops {label}: {row[1:4]}")
    return row, pair.commands


def op_bench(ws: Workspace) -> Section:
    rows: list[list[str]] = []
    commands: list[str] = []
    for label, recipe, overrides in WORKLOADS:
        row, cmds = measure(ws, label, recipe, overrides)
        rows.append(row)
        commands += [f"# {label}, {who}\n{c}" for who, c in cmds.items()]
    return Section(
        title="1c. Work per step: the operators a logging-free step runs, dtrain vs the plain loop",
        what=(
            f"Steps {FIRST}-{LAST} of {LAST + 2} (logging every 10 steps under both), one run "
            "of each program per workload, rank 0's torch.profiler trace (CPU activity); "
            "`cpu_op` events counted by name (`bench/op_bench.py`). A count does not move "
            "with the machine's speed: it says whether dtrain's step does more than the "
            "plain loop's where the wall-time ratios of sections 1, 1b, HF and Custom are "
            "inside their rounds' spread. Host reads (`aten::_local_scalar_dense`: "
            "`.item()`, `float(t)`) are the operators that would wait for a GPU if the "
            "tensor read were on it; here nearly all are AdamW's per-parameter step "
            "counters, which torch keeps on the CPU (`capturable=False`), in both programs."
        ),
        table=markdown_table(HEADERS, rows),
        commands=commands,
    )
