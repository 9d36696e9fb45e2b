"""The plan's memory and communication estimates against ``dtrain simulate`` (issue 26,
part 4): one rank of each layout, world 8 to 4,096, run on the fake process group.

    .venv/bin/python bench/run.py --only simulate --out /tmp/simulate.md
    .venv/bin/python bench/simulate_bench.py            # the table alone, on stdout

Each point is one ``dtrain simulate ... --ranks R --steps 1 --jobs 1 --json`` (one rank,
one process at a time, ``OMP_NUM_THREADS=1``); gpt_1b's steps run on fake tensors
(``--compute fake``: shapes only), gpt_small's for real, the tiny Llama's as ``auto``
picks. The plan's estimate is made for the rank holding the most; the rank chosen is that
one: rank 0 (dp rank 0 holds FSDP's largest chunks; at pp=2 the first stage holds the
position embedding besides what the last stage's head matches). Activations are compared
with the plan's figure for the rank's own pipeline stages (the last one keeps the logits).
Ratio = estimate / measured.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from harness import BIN, REPO, Section, Workspace, load_average, log, markdown_table

ROWS = ("params", "grads", "optimizer", "activations", "dp_bytes_per_step")
SMALL = ("recipe=gpt_small", "parallel.nnodes=1")
BIG = ("recipe=gpt_1b",)
OWN = ("recipe=own_lm",)  # a model of one's own: bench/own_model/own_lm.py (SDPA, LayerNorm)
OWN_DIR = ("--config-dir", str(REPO / "bench" / "own_model"))
EIGHT_A_NODE = ("parallel.nproc_per_node=8",)


@dataclass(kw_only=True)
class Point:
    label: str
    overrides: tuple[str, ...]
    compute: str = "fake"
    rank: int = 0
    quick: bool = False
    """In the ``--quick`` grid."""
    extra: tuple[str, ...] = field(default=())


# Pure FSDP at dp=4,096 is the slowest point (about 3.5 min here): FSDP2 splits every
# tensor into dp chunks at each gather and reduce-scatter, 4,096 fake tensors each.
GRID: list[Point] = [
    Point(label="gpt_small ddp", overrides=(*SMALL, "dp=8"), compute="real", quick=True),
    Point(label="gpt_small zero1", overrides=(*SMALL, "dp=8", "parallel.strategy=zero1"),
          compute="real"),
    Point(label="gpt_small fsdp", overrides=(*SMALL, "dp=8", "parallel.strategy=fsdp"),
          compute="real", quick=True),
    Point(label="llama_tiny_hf fsdp", overrides=("recipe=llama_tiny_hf", "dp=512",
          "parallel.nnodes=64", "parallel.nproc_per_node=8", "parallel.strategy=fsdp",
          "train.global_batch_size=512"), compute="auto"),
    Point(label="own_lm (custom) ddp bf16", overrides=(*OWN, "dp=8", *EIGHT_A_NODE,
          "precision=bf16", "train.global_batch_size=64"), compute="real", extra=OWN_DIR),
    Point(label="own_lm (custom) fsdp bf16", overrides=(*OWN, "dp=512", *EIGHT_A_NODE,
          "parallel.nnodes=64", "parallel.strategy=fsdp", "precision=bf16",
          "train.global_batch_size=512"), compute="auto", extra=OWN_DIR),
    Point(label="gpt_1b zero1", overrides=(*BIG, "dp=512", "parallel.nnodes=64",
          "parallel.strategy=zero1")),
    Point(label="gpt_1b fsdp", overrides=(*BIG, "dp=8", "parallel.nnodes=1",
          "parallel.strategy=fsdp")),
    Point(label="gpt_1b fsdp", overrides=(*BIG, "dp=64", "parallel.nnodes=8",
          "parallel.strategy=fsdp")),
    Point(label="gpt_1b fsdp", overrides=(*BIG, "dp=512", "parallel.nnodes=64",
          "parallel.strategy=fsdp"), quick=True),
    Point(label="gpt_1b fsdp", overrides=(*BIG, "dp=4096", "parallel.nnodes=512",
          "parallel.strategy=fsdp")),
    Point(label="gpt_1b hsdp", overrides=(*BIG, "dp=4096", "parallel.nnodes=512",
          "parallel.strategy=hsdp")),
    Point(label="gpt_1b fsdp+tp", overrides=(*BIG, "dp=64", "tp=8", "parallel.nnodes=64",
          "parallel.strategy=fsdp")),
    Point(label="gpt_1b ddp+tp", overrides=(*BIG, "dp=16", "tp=8", "parallel.nnodes=16")),
    Point(label="gpt_1b ddp+tp+pp", overrides=(*BIG, "dp=64", "tp=8", "pp=2",
          "parallel.nnodes=128"), quick=True),
    Point(label="gpt_1b fsdp+tp+pp", overrides=(*BIG, "dp=256", "tp=8", "pp=2",
          "parallel.nnodes=512", "parallel.strategy=fsdp")),
]  # fmt: skip


def world(p: Point) -> int:
    dims = dict(o.split("=", 1) for o in p.overrides)
    return math.prod(int(dims.get(k, 1)) for k in ("dp", "tp", "pp"))


def simulate(ws: Workspace, p: Point) -> tuple[dict, float, list[str]]:
    """(rank's report, wall s, the command) of one point."""
    argv = [str(BIN / "python"), "-m", "dtrain_cli", "simulate", *p.overrides, *p.extra]
    argv += ["--ranks", str(p.rank), "--steps", "1", "--jobs", "1", "--compute", p.compute]
    argv += ["--json", "--out", str(ws.runs)]
    env = ws.env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    run = subprocess.run(argv, cwd=ws.root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"{p.label} world {world(p)}: {run.stderr.strip()[-400:]}")
    (doc,) = json.loads(run.stdout)
    return doc["ranks"][0], wall, argv


def ratio(est: float, meas: float) -> float | None:
    return est / meas if meas else None


def row_of(p: Point, rank: dict, wall: float) -> tuple[list[str], dict[str, float | None]]:
    cells, ratios = [p.label, f"{world(p):,}", str(rank["rank"])], {}
    for k in ROWS:
        b = rank["bytes"][k]
        r = ratio(b["estimate"], b["measured"])
        ratios[k] = r
        shown = "-" if r is None else f"{r:.2f}"
        cells.append(f"{b['estimate'] / 2**20:,.0f} / {b['measured'] / 2**20:,.0f} ({shown})")
    cells.append(f"{wall:.0f}")
    return cells, ratios


def worst(all_ratios: list[tuple[str, str, float | None]]) -> str:
    known = [(lbl, k, r) for lbl, k, r in all_ratios if r]
    if not known:
        return "no ratios"
    lbl, k, r = max(known, key=lambda x: abs(math.log(x[2])))
    return f"{r:.2f} ({k}, {lbl})"


def simulate_bench(ws: Workspace) -> Section:
    grid = [p for p in GRID if p.quick] if ws.quick else GRID
    rows, ratios, mem_ratios, t0 = [], [], [], time.perf_counter()
    load = load_average()
    for p in grid:
        log(f"simulate: {p.label} world {world(p)}")
        try:
            rank, wall, argv = simulate(ws, p)
        except RuntimeError as exc:  # one layout's failure is a row, not the section's end
            rows.append([p.label, f"{world(p):,}", "0", f"FAILED: {exc}", *[""] * len(ROWS)])
            continue
        cells, rs = row_of(p, rank, wall)
        rows.append(cells)
        where = f"{p.label} @ {world(p):,}"
        ratios += [(where, k, r) for k, r in rs.items()]
        mem_ratios += [(where, k, r) for k, r in rs.items() if k != "activations"]
    heads = ["layout", "world", "rank", *(f"{k} MiB est / meas (ratio)" for k in ROWS), "wall s"]
    return Section(
        title="Plan estimates against `dtrain simulate` (issue 26, part 4)",
        what=(
            f"{len(grid)} layouts, one rank each, world {min(world(p) for p in grid):,} to "
            f"{max(world(p) for p in grid):,}, {time.perf_counter() - t0:.0f} s in all "
            f"(load average {load} at start; {time.strftime('%Y-%m-%d')}). Each cell: the "
            "plan's estimate / the simulated rank's measured bytes (ratio est/meas). Memory "
            "per rank: parameter, gradient and optimizer-state bytes held, activations kept "
            "per micro-batch; bytes per step: what the rank sends over dp in one step."
        ),
        table=markdown_table(heads, rows),
        notes=[
            f"worst ratio, all rows: {worst(ratios)}; params/grads/optimizer/dp bytes "
            f"only: {worst(mem_ratios)}",
        ],
        commands=[" ".join(argv).replace(str(ws.root), "$W").replace(str(REPO), "$REPO")],
    )


if __name__ == "__main__":
    ws = Workspace.create("--quick" in sys.argv)
    os.makedirs(ws.runs, exist_ok=True)
    print(simulate_bench(ws).markdown())
