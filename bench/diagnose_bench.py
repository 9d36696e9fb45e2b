"""What dtrain's run diagnostics cost (issue 14): the hang watchdog and per-rank times
(stragglers) on vs off, and how long a hang takes to end the job.

    .venv/bin/python bench/run.py --only diagnose

- per-step cost: ``dtrain launch`` dp=2 gpt_tiny logging every step (the worst case for
  the per-rank slots of the logging all-reduce), rounds of off / on interleaved (order
  flipped every round); ms per step from metrics.jsonl between two step records; the
  table shows each round's on - off difference, the spread of those differences is the
  noise.
- hang to exit: rank 1 never joins the logging all-reduce of step 10
  (``DTRAIN_FAULTS=hang:step=10:rank=1``), ``debug.collective_timeout_s=10``; from the
  moment the step started (the watchdog's record) to the launcher's exit.
"""

from __future__ import annotations

import json
import subprocess
import time

from harness import (
    BIN,
    Cmd,
    Section,
    Workspace,
    interleaved,
    log,
    markdown_table,
    median,
    run_timed,
    spread,
)

STEPS, FROM = 40, 10
BASE = (
    "recipe=gpt_tiny",
    "dp=2",
    "train.global_batch_size=8",
    "logging.every=1",
    "train.eval_every=0",
    "train.eval_batches=1",
    "logging.tensorboard=false",
    "logging.progress=lines",
)
VARIANTS = {
    "off": ("debug.collective_timeout_s=0", "debug.rank_times=false"),
    "on": (),  # the defaults: watchdog at 300 s, per-rank times at every logging step
}
TIMEOUT_S = 10


def launch_cmd(name: str, *extra: str, steps: int = STEPS) -> Cmd:
    argv = [str(BIN / "dtrain"), "launch", *BASE, f"train.steps={steps}", f"run.name={name}"]
    return Cmd([*argv, *extra])


def ms_per_step(ws: Workspace, name: str) -> float:
    records = [json.loads(line) for line in (ws.runs / name / "metrics.jsonl").open()]
    times = {r["step"]: r["time"] for r in records if r["kind"] == "train"}
    return 1000 * (times[STEPS] - times[FROM]) / (STEPS - FROM)


def hang_to_exit(ws: Workspace, name: str) -> tuple[float, int]:
    cmd = launch_cmd(name, f"debug.collective_timeout_s={TIMEOUT_S}", steps=STEPS)
    env = ws.env(DTRAIN_FAULTS="hang:step=10:rank=1")
    proc = subprocess.run(cmd.argv, cwd=ws.root, env=env, capture_output=True, timeout=300)
    ended = time.time()
    hang = ws.runs / name / "logs" / "hang"
    records = [json.loads(p.read_text()) for p in hang.glob("rank_*.json")]
    started = min(r["time"] - r["waited_s"] for r in records)
    return ended - started, proc.returncode


def diagnose_bench(ws: Workspace) -> Section:
    rounds = 2 if ws.quick else 4
    ms: dict[str, list[float]] = {k: [] for k in VARIANTS}
    cmds: list[str] = []
    for r, variant in interleaved(rounds, list(VARIANTS)):
        name = ws.next_name(f"diag-{variant}")
        cmd = launch_cmd(name, *VARIANTS[variant])
        run_timed(cmd, ws)
        ms[variant].append(ms_per_step(ws, name))
        if r == 0:
            cmds.append(cmd.shown(ws))
        log(f"diagnose round {r} {variant}: {ms[variant][-1]:.1f} ms/step")
    diffs = [on - off for on, off in zip(ms["on"], ms["off"], strict=True)]
    hangs = []
    for _ in range(1 if ws.quick else 2):
        name = ws.next_name("diag-hang")
        took, code = hang_to_exit(ws, name)
        hangs.append((took, code))
        log(f"hang to exit {took:.1f} s (exit code {code})")
    cmds.append(
        "DTRAIN_FAULTS=hang:step=10:rank=1 "
        + launch_cmd("diag-hang", f"debug.collective_timeout_s={TIMEOUT_S}").shown(ws)
    )

    def fmt(v: float) -> str:
        return f"{v:.1f}"

    rows = [
        ["ms/step, off", spread(ms["off"], fmt)],
        ["ms/step, on (defaults)", spread(ms["on"], fmt)],
        ["on - off per round, ms/step", ", ".join(f"{d:+.1f}" for d in diffs)],
        [
            "median difference",
            f"{median(diffs):+.1f} ms ({100 * median(diffs) / median(ms['off']):+.1f}%)",
        ],
        [
            f"hang -> exit, s (timeout {TIMEOUT_S} s)",
            ", ".join(f"{t:.1f} (exit {c})" for t, c in hangs),
        ],
    ]
    return Section(
        title="Run diagnostics: watchdog and per-rank times, hang to exit",
        what=(
            f"dp=2 gpt_tiny, {STEPS} steps, logging every step (per-rank times in every "
            f"all-reduce), steps {FROM}-{STEPS} timed, {rounds} rounds off/on interleaved. "
            "off: `debug.collective_timeout_s=0 debug.rank_times=false`; on: the defaults. "
            "Target: the difference within the round-to-round noise. Hang: from the start "
            "of the step that hung to the launcher's exit."
        ),
        table=markdown_table(["measure", "value"], rows),
        commands=cmds,
    )
