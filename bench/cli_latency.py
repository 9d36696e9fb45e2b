"""Benchmark 2: wall time of short CLI commands, from process start to exit."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from harness import (
    BIN,
    EN_DASH,
    Cmd,
    Section,
    Workspace,
    interleaved,
    log,
    markdown_table,
    rounds_label,
    run_guarded,
    spread,
    used_rounds,
)


@dataclass(frozen=True)
class Probe:
    label: str
    argv: tuple[str, ...]
    target: str
    env: tuple[tuple[str, str], ...] = ()
    new_value: str | None = None
    """A key given a value no round has used (``train.seed=1001``, ``1002``...)."""

    def argv_for(self, round_: int) -> list[str]:
        extra = [f"{self.new_value}={1001 + round_}"] if self.new_value else []
        return [*self.argv, *extra]


PLAN = (str(BIN / "dtrain"), "plan", "recipe=gpt_small", "dp=4", "pp=2")
HELP = (str(BIN / "dtrain"), "--help")
NOWHERE = (("DTRAIN_CACHE", "/dev/null"),)


REFERENCE = "torchrun --help"
PROBES = (
    Probe("dtrain --help", HELP, "≤ 0.1 x torchrun --help"),
    # the first time: the page is rendered by Typer (an unwritable cache keeps nothing)
    Probe("DTRAIN_CACHE=/dev/null dtrain --help", HELP, "(the first time)", NOWHERE),
    Probe("dtrain plan recipe=gpt_small dp=4 pp=2", PLAN, "≤ 0.2 x torchrun --help"),
    # the first time: the composition is not in the cache (an unwritable one keeps nothing)
    Probe(
        "DTRAIN_CACHE=/dev/null dtrain plan recipe=gpt_small dp=4 pp=2",
        PLAN,
        "(the first time)",
        NOWHERE,
    ),
    # other values, the same group options: Hydra's merge is read back, the values set on it
    Probe(
        "dtrain plan recipe=gpt_small dp=4 pp=2 train.seed=N (N new every round)",
        PLAN,
        "(values changed)",
        new_value="train.seed",
    ),
    Probe(REFERENCE, (str(BIN / "torchrun"), "--help"), "reference"),
    Probe("python -c pass", (sys.executable, "-c", "pass"), "floor: the interpreter"),
    Probe("python -c 'import torch'", (sys.executable, "-c", "import torch"), "reference"),
)


def cli_latency(ws: Workspace) -> Section:
    reps = 2 if ws.quick else 7
    walls: dict[str, list[float]] = {p.label: [] for p in PROBES}
    clean: dict[str, list[bool]] = {p.label: [] for p in PROBES}
    by_label = {p.label: p for p in PROBES}
    for probe in PROBES:  # a warm-up, not counted: the rows say "run again" (caches filled)
        run_guarded(Cmd(probe.argv_for(-1), shown_env=dict(probe.env)), ws, probe.label)
    for round_, label in interleaved(reps, list(walls)):
        probe = by_label[label]
        cmd = Cmd(probe.argv_for(round_), shown_env=dict(probe.env))
        walls[label].append(run_guarded(cmd, ws, label).wall_s)
        clean[label].append(not ws.guard.last_disturbed)
    log("cli: " + ", ".join(f"{k} {min(v):.2f}s" for k, v in walls.items()))
    rows = []
    for p in PROBES:
        used = used_rounds(clean[p.label], clean[REFERENCE])
        ratios = [walls[p.label][i] / walls[REFERENCE][i] for i in used]
        rows.append(
            [
                f"`{p.label}`",
                rounds_label(clean[p.label], clean[REFERENCE]),
                spread([walls[p.label][i] for i in used], lambda x: f"{x:.3f}"),
                spread(ratios, lambda x: f"{x:.3f}"),
                p.target,
            ]
        )
    return Section(
        title="2. CLI latency",
        what=(
            "Wall seconds from starting the process to its exit (subprocess, output to a "
            "file), after one uncounted run of each command (it fills the caches below), "
            "the commands interleaved round-robin with the order reversed every "
            "round. `python -c 'import torch'` and `torchrun --help` show the cost of "
            "importing torch, which `dtrain --help` and `dtrain plan` must avoid. `dtrain "
            "--help` run again prints the page Typer rendered the first time (`help/`, "
            "keyed by the words asked for, dtrain's code, the installed Typer, click and "
            "rich, and the terminal's size and settings) without importing Typer; the row "
            "below it renders the page every time. `dtrain "
            "plan` run again finds its typed config in the cache (`composed/`, keyed by "
            "recipe, overrides, config files and dtrain's code) and imports neither Hydra "
            "nor OmegaConf; the row below it is the "
            "same command composed every time (`DTRAIN_CACHE=/dev/null` keeps nothing), and "
            "the next the same layout with a value no earlier round used (`train.seed`): "
            "Hydra's merge of the recipe and its group options is read back and the values "
            "are checked and set on it. "
            "The ratio "
            "to `torchrun --help` is taken round by round (rounds where either was "
            "disturbed left out)."
        ),
        table=markdown_table(
            [
                "command",
                "reps used",
                f"wall s, median (min{EN_DASH}max)",
                "/ torchrun --help, per round",
                "target",
            ],
            rows,
        ),
        commands=[Cmd(p.argv_for(0), shown_env=dict(p.env)).shown(ws) for p in PROBES],
    )
