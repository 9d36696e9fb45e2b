"""The consistency trade-off, measured (issue 15): the same gpt_small run synchronously,
through a parameter server with bounded staleness 0/1/2/4, and with DiLoCo every 4/16,
with one of 4 workers slowed 2x by a drill (``DTRAIN_FAULTS=slow:rank=1:factor=2``).

    .venv/bin/python bench/run.py --only async

Each run sees the same number of samples; the loss is the validation loss at the end
(the same first validation batches for all). Logging only at the last step: a logging
step's all-reduce lines the workers up again, which would hide the asynchrony.
"""

from __future__ import annotations

import json
import subprocess

from harness import BIN, Section, Workspace, log, markdown_table
from layout_bench import COMMON

SLOW = "slow:rank=1:factor=2"


def launch(ws: Workspace, args: list[str], env: dict[str, str]) -> dict:
    name = ws.next_name("async")
    cmd = [str(BIN / "dtrain"), "launch", *args, *COMMON, f"run.root={ws.runs}", f"run.name={name}"]
    proc = subprocess.run(
        cmd, cwd=ws.root, env=ws.env(**env), capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads((ws.runs / name / "summary.json").read_text())


def _bytes_per_sample(s: dict, dp: int, global_batch: int) -> float:
    """All ranks' sent bytes per step / samples per step."""
    if "param_server" in s:
        b = s["param_server"]["bytes_per_step_measured"]
        return dp * (b["sent"] + b["received"]) / global_batch  # workers' push + servers' pull
    if "diloco_bytes_per_step_measured" in s:
        return dp * s["diloco_bytes_per_step_measured"] / global_batch
    return dp * s["comm_bytes_per_step_estimate"] / global_batch


def async_bench(ws: Workspace) -> Section:
    steps = 4 if ws.quick else 8
    gb = 8
    base = [
        "recipe=gpt_small",
        "dp=4",
        f"train.steps={steps}",
        f"logging.every={steps}",
        f"train.global_batch_size={gb}",
        "train.micro_batch_size=2",
    ]
    runs = [
        ("sync DDP", []),
        *[
            (f"param_server, staleness {k}", ["sync.mode=param_server", f"sync.max_staleness={k}"])
            for k in (0, 1, 2, 4)
        ],
        *[(f"DiLoCo every {e}", ["sync.mode=diloco", f"sync.every={e}"]) for e in (4, 16)],
    ]
    rows, commands = [], []
    for label, extra in runs:
        log(f"async: {label}")
        args = [*base, *extra]
        s = launch(ws, args, {"DTRAIN_FAULTS": SLOW})
        commands.append(f"DTRAIN_FAULTS={SLOW} dtrain launch {' '.join(args)}")
        ps = s.get("param_server", {})
        hist = ps.get("staleness_hist_applied", {})
        stale = sorted({int(v) for h in hist.values() for v in h})
        waits = ps.get("bound_wait_s_per_worker")
        rows.append(
            [
                label,
                f"{steps * gb * 256 / s['train_wall_s']:,.0f}",  # one window: the whole run
                f"{s['val_loss']:.4f}",
                f"{_bytes_per_sample(s, 4, gb) / 1e6:,.2f}",
                ", ".join(map(str, stale)) if stale else "-",
                ", ".join(f"{w:.1f}" for w in waits) if waits else "-",
            ]
        )
    table = markdown_table(
        [
            "mode (4 workers, rank 1 slowed 2x)",
            "tokens/s (whole run)",
            f"val loss after {steps * gb} samples",
            "MB sent per sample (all ranks)",
            "staleness seen",
            "bound wait s per worker",
        ],
        rows,
    )
    return Section(
        title="Asynchronous and low-communication training (issue 15)",
        what=(
            f"gpt_small, dp=4 on this machine, {steps} steps of {gb} samples, worker 1 "
            "sleeping 1x its step time after every step. param_server: 1 server process "
            "(5 processes); DiLoCo: outer lr 0.7, Nesterov 0.9. The bytes for sync DDP are "
            "the plan's ring estimate; for the others counted from the buffers sent."
        ),
        table=table,
        commands=commands,
        notes=[
            "On 2 shared cores the extra server process competes with the workers for CPU; "
            "the staleness bound's effect is the waits column: staleness 0 makes the fast "
            "workers wait for the slow one at every step, a larger bound lets them run ahead.",
            "With so few steps DiLoCo every 16 never reaches an outer step before the end "
            "(the final outer step runs at the end); its loss is the averaged replicas'.",
        ],
    )
