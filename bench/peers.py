"""Benchmark 4: dtrain against its peers on the same model object and data.

The programs: ``dtrain launch``; ``torchrun`` + :mod:`plain_ddp` (the plain loop);
Lightning Fabric (:mod:`peer_fabric`, its own launcher); the Lightning Trainer
(:mod:`peer_trainer`, its own launcher); accelerate (:mod:`peer_accelerate`,
``accelerate launch``). All train ``dtrain_cli.models.gpt.net.GPT`` on dtrain's sample
stream with the same optimizer, schedule, clipping and DDP options (:mod:`loop_common`);
their flags come from the first dtrain run's config.yaml/plan.yaml, as for the plain loop.
The peers run from ``bench/.venv-peers`` (``make bench-peers-env``): Lightning and
accelerate are never dtrain dependencies.

Three workloads, each in alternating rounds over the five programs: the fixed per-step
cost (1-layer width-16 model, micro-batch 1, 300 steps), the time from the command to the
end of step 1 (gpt_tiny, 2 ranks), and steady tokens/s (gpt_tiny, steps 11-60); and the
``--help`` latency of each command line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    median,
    run_guarded,
    run_timed,
    spread,
)
from programs import DP, Pair, Workload, loop_args
from throughput import TINY_MODEL

PEERS_BIN = REPO / "bench" / ".venv-peers" / "bin"
PROGRAMS = ("plain", "dtrain", "fabric", "trainer", "accelerate")
# run order of a round (reversed every other round); dtrain first, as the others' flags
# come from its first run's config.yaml/plan.yaml
ORDER = ("dtrain", "fabric", "trainer", "accelerate", "plain")
NAMES = {
    "plain": "plain torchrun + DDP loop",
    "dtrain": "dtrain",
    "fabric": "Lightning Fabric",
    "trainer": "Lightning Trainer",
    "accelerate": "accelerate",
}


def peer_cmd(program: str, work: Workload, args: list[str]) -> Cmd:
    """The command line of a peer for one workload (flags as for plain_ddp.py)."""
    tail = loop_args(work, args)
    script = str(REPO / "bench" / f"peer_{program}.py")
    if program in ("fabric", "trainer"):  # their own launchers start the other rank
        argv = [str(PEERS_BIN / "python"), script, "--nproc", str(DP), *tail]
    elif program == "accelerate":
        argv = [
            str(PEERS_BIN / "accelerate"),
            "launch",
            "--multi_gpu",  # several processes; on a machine without GPUs they use the CPU
            "--num_processes",
            str(DP),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            script,
            *tail,
        ]
    else:
        raise ValueError(program)
    return Cmd(argv, t0_var="BENCH_T0")


def run_peer(ws: Workspace, program: str, work: Workload, args: list[str]) -> dict[str, Any]:
    cmd = peer_cmd(program, work, args)
    timed = (work.timed_from, work.steps)
    done = guarded(ws, lambda: run_timed(cmd, ws, timed), f"{work.label} ({program})")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith('{"bench": '):
            return {**json.loads(line), "wall_s": done.wall_s, "command": cmd.shown(ws)}
    raise RuntimeError(f"no result line from {cmd.shell()}:\n{done.stdout[-2000:]}")


@dataclass
class Rounds:
    """Per-round results of every program on one workload."""

    work: Workload
    results: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {p: [] for p in PROGRAMS}
    )
    commands: dict[str, str] = field(default_factory=dict)

    def values(self, program: str, key: str) -> list[float]:
        return [r[key] for r in self.results[program]]

    def per_round(self, program: str, key: str, op: Callable[[float, float], float]) -> list:
        """``op(program's value, plain's value)`` round by round."""
        mine, plain = self.values(program, key), self.values("plain", key)
        return [op(a, b) for a, b in zip(mine, plain, strict=True)]

    def same_params(self, program: str) -> float:
        pairs = zip(
            self.values(program, "param_sum"), self.values("plain", "param_sum"), strict=True
        )
        return max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs)


def measure(ws: Workspace, work: Workload, rounds: int) -> Rounds:
    pair, out = Pair(ws, work), Rounds(work)
    for r, program in interleaved(rounds, ORDER):
        if program == "dtrain":
            run = pair.dtrain()
            w = work
            record = {
                "ms_per_step": run.ms_per_step(w.timed_from, w.steps),
                "first_step_done_s": run.summary.get("startup_first_step_done_s", float("nan")),
                "param_sum": run.summary["param_sum"],
                "wall_s": run.wall_s,
            }
            record["tokens_per_s"] = 1000 * run.tokens_per_step / record["ms_per_step"]
        elif program == "plain":
            record = pair.plain()
        else:
            assert pair.plain_args is not None
            record = run_peer(ws, program, work, pair.plain_args)
            out.commands.setdefault(program, record.pop("command"))
        out.results[program].append(record)
        log(
            f"peers {work.label} round {r + 1}/{rounds} {program}: "
            f"{record['ms_per_step']:.2f} ms/step, first step {record['first_step_done_s']:.2f} s"
        )
    out.commands.update(pair.commands)
    return out


@dataclass(frozen=True)
class HelpProbe:
    program: str
    argv: tuple[str, ...]


HELP_PROBES = (
    HelpProbe("dtrain", (str(BIN / "dtrain"), "--help")),
    HelpProbe("plain", (str(BIN / "torchrun"), "--help")),
    HelpProbe("fabric", (str(PEERS_BIN / "fabric"), "--help")),
    HelpProbe("trainer", (str(PEERS_BIN / "python"), "-c", "import lightning.pytorch")),
    HelpProbe("accelerate", (str(PEERS_BIN / "accelerate"), "--help")),
)


def help_latency(ws: Workspace, reps: int) -> dict[str, list[float]]:
    walls: dict[str, list[float]] = {p.program: [] for p in HELP_PROBES}
    by_name = {p.program: p for p in HELP_PROBES}
    for _, name in interleaved(reps, list(walls)):
        walls[name].append(run_guarded(Cmd(list(by_name[name].argv)), ws, name).wall_s)
    return walls


def _s(x: float) -> str:
    return f"{x:.2f}"


def _ms(x: float) -> str:
    return f"{x:.2f}"


def _pm(x: float) -> str:
    return f"{x:+.2f}"


def _ratio(x: float) -> str:
    return f"{x:.2f}"


def peers_bench(ws: Workspace) -> Section:
    if not (PEERS_BIN / "python").exists():
        raise RuntimeError(f"{PEERS_BIN.parent} is missing: run `make bench-peers-env` first")
    quick = ws.quick
    fixed = measure(
        ws,
        Workload("peers-fixed", "gpt_tiny", 300, 50, 50, TINY_MODEL),
        2 if quick else 5,
    )
    startup = measure(
        ws,
        Workload("peers-startup", "gpt_tiny", 2, 1, 1, ("optim.warmup_steps=0",)),
        2 if quick else 5,
    )
    steady = measure(ws, Workload("peers-steady", "gpt_tiny", 60, 10, 10), 2 if quick else 3)
    walls = help_latency(ws, 2 if quick else 5)
    targets = {
        "fixed": "≤ +0.30 ms",
        "first": "≤ 0.80 x plain",
        "steady": "≥ 0.98 x plain",
        "help": "≤ 0.3 s",
    }

    def cells(program: str) -> list[str]:
        diff = fixed.per_round(program, "ms_per_step", lambda a, b: a - b)
        first = startup.per_round(program, "first_step_done_s", lambda a, b: a / b)
        tps = steady.per_round(program, "tokens_per_s", lambda a, b: a / b)
        return [
            f"{spread(fixed.values(program, 'ms_per_step'), _ms)}; "
            f"{spread(diff, _pm) if program != 'plain' else '+0'}",
            f"{spread(startup.values(program, 'first_step_done_s'), _s)}; "
            f"{spread(first, _ratio) if program != 'plain' else '1.00'}x",
            f"{spread(steady.values(program, 'tokens_per_s'), lambda x: f'{x:,.0f}')}; "
            f"{spread(tps, lambda x: f'{x:.3f}') if program != 'plain' else '1.000'}x",
            spread(walls[program], lambda x: f"{x:.2f}"),
            f"{max(fixed.same_params(program), steady.same_params(program)):.1e}",
        ]

    headers = [
        "program",
        "fixed cost: ms/step; minus plain, per round (ms)",
        "time to end of step 1: s; ratio to plain",
        "steady gpt_tiny tokens/s; ratio to plain",
        "`--help` / import, s",
        "final params vs plain (max rel. diff)",
    ]
    rows = [[NAMES[p], *cells(p)] for p in PROGRAMS]
    rows.append(
        [
            "dtrain target",
            targets["fixed"],
            targets["first"],
            targets["steady"],
            targets["help"],
            "same job",
        ]
    )
    d_fixed = median(fixed.per_round("dtrain", "ms_per_step", lambda a, b: a - b))
    d_first = median(startup.per_round("dtrain", "first_step_done_s", lambda a, b: a / b))
    d_tps = median(steady.per_round("dtrain", "tokens_per_s", lambda a, b: a / b))
    verdict = (
        f"dtrain: fixed cost {d_fixed:+.2f} ms/step over plain "
        f"({'met' if d_fixed <= 0.3 else 'NOT met'}); first step {d_first:.2f} x plain "
        f"({'met' if d_first <= 0.8 else 'NOT met'}); steady tokens/s {d_tps:.3f} x plain "
        f"({'met' if d_tps >= 0.98 else 'NOT met'})."
    )
    log(verdict)
    commands = []
    for label, res in (("fixed", fixed), ("startup", startup), ("steady", steady)):
        commands += [f"# {label}, {p}\n{res.commands[p]}" for p in PROGRAMS if p in res.commands]
    commands += [f"# --help, {p.program}\n{Cmd(list(p.argv)).shown(ws)}" for p in HELP_PROBES]
    return Section(
        title=(
            "4. Peers: dtrain, the plain loop, Lightning Fabric, the Lightning Trainer, accelerate"
        ),
        what=(
            "Every program trains the same `GPT` class on the same sample stream, per-rank "
            "batches, AdamW groups, warmup + cosine schedule, clipping and DDP options "
            "(`bench/loop_common.py`), 2 processes x 1 thread, gloo; the peers from "
            "`bench/.venv-peers` (lightning 2.6.6, accelerate 1.15.0, the same torch). The five "
            "programs alternate round by round (order reversed every round); cells are "
            f"median (min{EN_DASH}max); ratios and differences to plain are taken round by "
            "round. Fixed cost: 1-layer width-16 GPT, block 32, micro-batch 1, "
            f"steps 51{EN_DASH}300 of 300 (dtrain `logging.every=50`). Time to first step: "
            "gpt_tiny (4 layers, width 128), 2 steps, from just before the command starts to "
            "the end of optimizer step 1 "
            f"on rank 0. Steady: gpt_tiny, micro-batch 8, steps 11{EN_DASH}60 of 60. `--help`: "
            "`dtrain --help`, `torchrun --help`, `fabric --help`, `python -c 'import "
            "lightning.pytorch'` (the Trainer has no CLI of its own), `accelerate --help`."
        ),
        table=markdown_table(headers, rows),
        notes=[verdict],
        commands=commands,
    )
