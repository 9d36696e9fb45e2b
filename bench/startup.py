"""Benchmark 3: time to first step, from the command's start to the end of step 1."""

from __future__ import annotations

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
from programs import Pair, Workload

DTRAIN_MILESTONES = {
    "startup_worker_start_s": "worker started",
    "startup_process_group_ready_s": "process group ready",
    "startup_model_ready_s": "model + data + optimizer ready",
}
PLAIN_MILESTONES = {
    "torch_imported_s": "worker imported torch",
    "process_group_ready_s": "process group ready",
    "model_ready_s": "model + data + optimizer ready",
}


def _milestones(records: list[dict[str, float]], names: dict[str, str]) -> str:
    parts = []
    for key, text in names.items():
        values = [r[key] for r in records if key in r]
        if values:
            parts.append(f"{text} {median(values):.2f}")
    return "; ".join(parts)


def time_to_first_step(ws: Workspace) -> Section:
    rounds = 2 if ws.quick else 5
    work = Workload("startup", "gpt_tiny", 2, 1, 1, ("optim.warmup_steps=0",))
    pair = Pair(ws, work)
    dtrain: list[dict[str, float]] = []
    own: list[dict[str, float]] = []
    plain: list[dict[str, float]] = []
    clean: dict[str, list[bool]] = {"dtrain": [], "own": [], "plain": []}
    for r, program in interleaved(rounds, ("dtrain", "plain", "own")):
        if program == "plain":
            plain.append(pair.plain())
            first = plain[-1]["first_step_done_s"]
        else:
            env = {"DTRAIN_WARM_POOL": "0"} if program == "own" else None
            run = pair.dtrain(env, label="dtrain, no warm pool" if env else "dtrain")
            (own if env else dtrain).append({**run.summary, "wall_s": run.wall_s})
            first = run.summary["startup_first_step_done_s"]
        clean[program].append(not ws.guard.last_disturbed)
        log(f"startup round {r + 1}/{rounds} {program}: first step done after {first:.2f} s")
    used = used_rounds(clean["dtrain"], clean["plain"], clean["own"])
    dtrain, plain, own = ([runs[i] for i in used] for runs in (dtrain, plain, own))
    label = rounds_label(clean["dtrain"], clean["plain"], clean["own"])
    d_first = [d["startup_first_step_done_s"] for d in dtrain]
    o_first = [d["startup_first_step_done_s"] for d in own]
    p_first = [p["first_step_done_s"] for p in plain]
    hydra = median([p["dtrain_imports_s"] for p in plain])
    rows = [
        [
            "`dtrain launch` (elastic agent, workers from the warm pool)",
            label,
            spread(d_first, lambda x: f"{x:.2f}"),
            spread([d["wall_s"] for d in dtrain], lambda x: f"{x:.2f}"),
            _milestones(dtrain, DTRAIN_MILESTONES),
        ],
        [
            "`DTRAIN_WARM_POOL=0 dtrain launch` (its own fork server)",
            label,
            spread(o_first, lambda x: f"{x:.2f}"),
            spread([d["wall_s"] for d in own], lambda x: f"{x:.2f}"),
            _milestones(own, DTRAIN_MILESTONES),
        ],
        [
            "`torchrun` + plain_ddp.py",
            label,
            spread(p_first, lambda x: f"{x:.2f}"),
            spread([p["wall_s"] for p in plain], lambda x: f"{x:.2f}"),
            _milestones(plain, PLAIN_MILESTONES)
            + f" (of which {hydra:.2f} importing dtrain_cli's modules)",
        ],
        [
            "dtrain / plain, per round (warm pool; no pool)",
            label,
            spread([d / p for d, p in zip(d_first, p_first, strict=True)], lambda x: f"{x:.3f}")
            + "; "
            + spread([d / p for d, p in zip(o_first, p_first, strict=True)], lambda x: f"{x:.3f}"),
            "",
            "",
        ],
    ]
    headers = [
        "program",
        "rounds used",
        "end of step 1, s",
        "command wall to exit, s",
        "milestones (median s after command start)",
    ]
    return Section(
        title="3. Time to first step: `dtrain launch recipe=gpt_tiny dp=2` vs torchrun",
        what=(
            "Seconds from just before the command is started (epoch time passed in "
            "`DTRAIN_LAUNCH_T0` / `BENCH_T0`) to the end of optimizer step 1 on rank 0: "
            "dtrain's summary `startup_first_step_done_s`, the plain script's own stamp. "
            f"2-step runs, data cache warm; median (min{EN_DASH}max)."
        ),
        table=markdown_table(headers, rows),
        commands=[f"# {k}\n{v}" for k, v in sorted(pair.commands.items())],
        notes=[
            "The plain script imports GPT, the data stream and the config dataclasses from "
            "dtrain_cli after its process group is up; that import is part of its time and "
            "is shown separately. dtrain's workers are forked from a fork server that has "
            "torch, the runtime and torch._dynamo (DDP needs it) imported: the warm pool's, "
            "forked for the launch by a pool an earlier launch started (the bench's warm-up "
            "started it; dtrain_cli/launch/warm_pool.py), or, with DTRAIN_WARM_POOL=0, one the "
            "launch starts first thing, which imports them while the launcher composes the "
            "config. torchrun's workers each import torch."
        ],
    )
