"""Benchmark: your own script under ``dtrain run`` vs ``torchrun``, the same script and args.

    .venv/bin/python bench/run.py --only script

tests/scripts/ddp_plain.py (a plain DDP loop written the torchrun way, no dtrain import)
under ``torchrun --standalone --nproc-per-node 2`` and under ``dtrain run dp=2 --``,
alternating (the order flips every round). Measured: seconds from just before the command
starts to the end of the script's first optimizer step (the script's own stamp in its
--out file, rank 0), and the command's wall time to exit for a short run.
"""

from __future__ import annotations

import json
import time

from harness import (
    BIN,
    EN_DASH,
    REPO,
    Cmd,
    Section,
    Workspace,
    guarded,
    interleaved,
    log,
    markdown_table,
    rounds_label,
    run_timed,
    spread,
    used_rounds,
)

SCRIPT = REPO / "tests" / "scripts" / "ddp_plain.py"
NPROC = 2
TARGET = 0.8  # dtrain's first step at most 0.8 x torchrun's


def commands(ws: Workspace, steps: int, out: str) -> dict[str, Cmd]:
    args = [str(SCRIPT), "--steps", str(steps), "--out", out]
    return {
        "torchrun": Cmd(
            [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={NPROC}", *args]
        ),
        "dtrain run": Cmd(
            [str(BIN / "python"), "-m", "dtrain_cli", "run", f"dp={NPROC}", "--", *args],
        ),
    }


def one(ws: Workspace, cmd: Cmd, out: str, what: str) -> tuple[float, float]:
    """(end of step 1, wall to exit), seconds after the command started."""

    def once() -> tuple[float, float]:
        t0 = time.time()
        done = run_timed(cmd, ws)
        first = json.loads((ws.root / out).read_text())["first_step"]
        return first - t0, done.wall_s

    return guarded(ws, once, what)


def script_vs_torchrun(ws: Workspace) -> Section:
    rounds, steps = (2, 20) if ws.quick else (5, 50)
    out = "script-bench.json"
    cmds = commands(ws, steps, out)
    first: dict[str, list[float]] = {name: [] for name in cmds}
    wall: dict[str, list[float]] = {name: [] for name in cmds}
    clean: dict[str, list[bool]] = {name: [] for name in cmds}
    for r, name in interleaved(rounds, list(cmds)):
        f, w = one(ws, cmds[name], out, f"script {name} round {r + 1}")
        first[name].append(f)
        wall[name].append(w)
        clean[name].append(not ws.guard.last_disturbed)
        log(f"script round {r + 1}/{rounds} {name}: first step {f:.2f} s, exit {w:.2f} s")
    used = used_rounds(*clean.values())
    label = rounds_label(*clean.values())
    pick = {n: ([first[n][i] for i in used], [wall[n][i] for i in used]) for n in cmds}
    (t_first, t_wall), (d_first, d_wall) = pick["torchrun"], pick["dtrain run"]
    s2 = lambda x: f"{x:.2f}"  # noqa: E731
    rows = [
        [f"`{name}`", label, spread(pick[name][0], s2), spread(pick[name][1], s2)] for name in cmds
    ]
    rows.append(
        [
            "dtrain run / torchrun, per round",
            label,
            spread([d / t for d, t in zip(d_first, t_first, strict=True)], s2),
            spread([d / t for d, t in zip(d_wall, t_wall, strict=True)], s2),
        ]
    )
    headers = ["program", "rounds used", "end of step 1, s", f"wall to exit ({steps} steps), s"]
    ratio = sorted(d / t for d, t in zip(d_first, t_first, strict=True))[len(d_first) // 2]
    return Section(
        title=f"Your own script: `dtrain run dp={NPROC} -- ddp_plain.py` vs torchrun",
        what=(
            f"tests/scripts/ddp_plain.py (plain DDP, torchrun-style, no dtrain import), "
            f"{NPROC} processes, {steps} steps, the same arguments under both. End of step 1: "
            "seconds from just before the command starts to the script's own stamp after "
            f"its first optimizer step (rank 0). Median (min{EN_DASH}max); rounds alternate, "
            f"the order flipping every round. Target: first step <= {TARGET} x torchrun "
            f"(median per-round ratio here: {ratio:.2f})."
        ),
        table=markdown_table(headers, rows),
        commands=[f"# {name}\n{cmd.shown(ws)}" for name, cmd in cmds.items()],
        notes=[
            "dtrain run starts its fork server first thing; the server imports torch and "
            "what a DDP script needs before step 1 (torch.distributed, DDP, torch._dynamo) "
            "while the launcher composes the config and imports torch for the elastic "
            "agent, and every rank is forked from it with all of that loaded. torchrun's "
            "ranks each start a fresh `python -u` that imports torch itself. "
            "`launcher.start_method=spawn` gives dtrain run torchrun's start-up.",
        ],
    )
