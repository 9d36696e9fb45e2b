"""dtrain's benchmark suite: ``make bench`` (= ``.venv/bin/python bench/run.py``).

    .venv/bin/python bench/run.py                 # everything (see bench/README.md)
    .venv/bin/python bench/run.py --quick         # smoke run: fewer rounds and steps
    .venv/bin/python bench/run.py --only cli      # one benchmark (repeatable)

Writes the whole of bench/RESULTS.md each run. No torch import here: every measured
program runs in its own process.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from advise_bench import advise_bench
from async_bench import async_bench
from calibration_bench import calibration_bench
from checkpoint_bench import checkpoint_bench
from cli_latency import cli_latency
from data_bench import data_loading
from diagnose_bench import diagnose_bench
from elastic_bench import elastic_bench
from harness import REPO, Section, Workspace, load_average, log, machine_lines
from layout_bench import pipeline_bench, strategy_bench
from model_bench import custom_overhead, hf_overhead
from op_bench import op_bench
from peers import peers_bench
from programs import Pair, Workload
from script_bench import script_vs_torchrun
from simulate_bench import simulate_bench
from startup import time_to_first_step
from throughput import fixed_cost, framework_overhead

BENCHMARKS: dict[str, Callable[[Workspace], Section]] = {
    "overhead": framework_overhead,
    "fixed_cost": fixed_cost,
    "ops": op_bench,
    "cli": cli_latency,
    "startup": time_to_first_step,
    "peers": peers_bench,
    "checkpoint": checkpoint_bench,
    "pipeline": pipeline_bench,
    "strategies": strategy_bench,
    "advise": advise_bench,
    "calibration": calibration_bench,
    "data": data_loading,
    "hf": hf_overhead,
    "custom": custom_overhead,
    "async": async_bench,
    "diagnose": diagnose_bench,
    "elastic": elastic_bench,
    "script": script_vs_torchrun,
    "simulate": simulate_bench,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Benchmark dtrain against plain torchrun + DDP.")
    p.add_argument("--quick", action="store_true", help="fewer rounds and steps (smoke run)")
    p.add_argument(
        "--only",
        action="append",
        choices=list(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=0,
        metavar="N",
        help="hf and custom: N rounds of 200 steps (their default: 5 of 60)",
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (run dirs)")
    return p.parse_args(argv)


def warm_up(ws: Workspace) -> None:
    """Tokenize the corpus into the scratch cache and run both programs once, uncounted,
    so no measured round pays for a cold cache (data, page cache, .pyc files)."""
    pair = Pair(ws, Workload("warmup", "gpt_tiny", 2, 1, 1, ("optim.warmup_steps=0",)))
    pair.dtrain()
    pair.plain()


def results_markdown(
    sections: list[Section], args: argparse.Namespace, ws: Workspace, load: tuple[str, str]
) -> str:
    cmd = (
        "make bench" if not (args.quick or args.only) else "bench/run.py " + " ".join(sys.argv[1:])
    )
    mode = "quick (smoke run; too few rounds to trust)" if args.quick else "full"
    head = [
        "# dtrain benchmark results",
        f"Written by `{cmd}` (`.venv/bin/python bench/run.py`), mode: {mode}. "
        "Each run overwrites this file; bench/README.md says what each benchmark measures.",
        "## Machine",
        "\n".join(
            [
                *machine_lines(),
                f"- load average (1/5/15 min) at start: {load[0]}; at end: {load[1]}",
                f"- {ws.guard.report()}",
                "- commands that failed and were run again: "
                + ("; ".join(ws.failures) if ws.failures else "none"),
                f"- `$REPO` = {REPO}; `$W` = a fresh scratch folder (`{ws.root}`), also the "
                "working directory of every command",
            ]
        ),
    ]
    return "\n\n".join([*head, *(s.markdown() for s in sections)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(dict.fromkeys(args.only or BENCHMARKS))
    ws = Workspace.create(args.quick, args.rounds)
    load_start = load_average()
    start = time.perf_counter()
    log(f"scratch folder {ws.root}; benchmarks: {', '.join(names)}")
    try:
        if set(names) & {"overhead", "fixed_cost", "startup", "peers"}:
            warm_up(ws)
        sections = [run_one(name, ws) for name in names]
        text = results_markdown(sections, args, ws, (load_start, load_average()))
        args.out.write_text(text)
    finally:
        # the bench's warm worker pool (started by its first launch) ends with it
        stop = [sys.executable, "-m", "dtrain_cli", "pool", "stop"]
        subprocess.run(stop, env=ws.env(), capture_output=True, timeout=60, check=False)
        if not args.keep:
            shutil.rmtree(ws.root, ignore_errors=True)
    failed = [s.title for s in sections if s.title.startswith(FAILED)]
    log(f"wrote {args.out} in {time.perf_counter() - start:.0f} s")
    if failed:
        log("failed: " + "; ".join(failed))
    return 1 if failed else 0


FAILED = "FAILED: "


def run_one(name: str, ws: Workspace) -> Section:
    """One benchmark's section; a benchmark that raises gets a section saying so, and the
    others still run (the exit code is then 1)."""
    t = time.perf_counter()
    try:
        section = BENCHMARKS[name](ws)
    except Exception as exc:  # a broken benchmark must not cost the others' results
        log(f"{name} failed after {time.perf_counter() - t:.0f} s: {exc!r}")
        detail = "\n".join(str(exc).splitlines()[-15:])
        return Section(
            title=f"{FAILED}{name}",
            what=f"`{type(exc).__name__}` after {time.perf_counter() - t:.0f} s:",
            table=f"```\n{detail}\n```",
        )
    log(f"{name} done in {time.perf_counter() - t:.0f} s")
    return section


if __name__ == "__main__":
    sys.exit(main())
