"""Data-loading benchmark: a dataset with a slow ``__getitem__`` and DataLoader workers.

    .venv/bin/python bench/run.py --only data

``tests/own_data.py``'s ``Pairs`` sleeps ``SLEEP_MS`` per item (a slow decode or
augmentation) and feeds a 2-layer gpt_tiny (one process, ``data=custom``); the run is repeated with
``data.num_workers`` 0, 2 and 12. Figures come from dtrain's own summary and metrics: the data
wait per step (time the training loop spent getting batches, averaged over every step,
the loader's start included) as a share of the steady step time (logging windows after
the first). Target: below 5% with workers.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess

from harness import BIN, REPO, Section, Workspace, log, markdown_table

SLEEP_MS = 20.0
# a small GPT and slow items, so that loading (16 items a step) is a visible part of a step
MODEL = ["model.n_layer=2", "model.block_size=64", "++data.block_size=64"]
# one worker yields a batch per 16 x 20 ms = 320 ms while a quiet step computes in ~40 ms:
# hiding the loading takes about 8 workers (they only sleep: no CPU taken from training)
WORKERS = (0, 2, 12)


def _launch(ws: Workspace, workers: int, steps: int) -> tuple[list[str], dict, list[dict]]:
    name = ws.next_name(f"data-w{workers}")
    args = [
        "recipe=gpt_tiny",
        "data=custom",
        "data._target_=tests.own_data.Pairs",
        "++data.n=2048",
        f"++data.sleep_ms={SLEEP_MS:g}",
        *MODEL,
        f"data.num_workers={workers}",
        f"train.steps={steps}",
        "logging.every=5",
        "optim.warmup_steps=2",
        "train.eval_every=0",
        "checkpoint.at_end=false",
        "logging.tensorboard=false",
        "logging.progress=lines",
    ]
    cmd = [str(BIN / "dtrain"), "launch", *args, f"run.root={ws.runs}", f"run.name={name}"]
    env = ws.env(PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, cwd=ws.root, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stderr[-2000:]}")
    run = ws.runs / name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    return args, json.loads((run / "summary.json").read_text()), train


def data_loading(ws: Workspace) -> Section:
    steps = 10 if ws.quick else 60
    rows, commands, curves = [], [], {}
    for workers in WORKERS:
        args, summary, train = _launch(ws, workers, steps)
        step_ms = statistics.median(r["step_time_ms"] for r in train[1:])
        wait_ms = summary["data_wait_ms_per_step"]
        steady_ms = statistics.median(r["data_wait_ms"] for r in train[1:])
        curves[workers] = [r["loss"] for r in train]
        log(f"data: num_workers={workers}: wait {wait_ms:.1f} ms of {step_ms:.1f} ms/step")
        rows.append(
            [
                str(workers),
                f"{step_ms:.1f}",
                f"{wait_ms:.1f} ({100 * wait_ms / step_ms:.1f}%)",
                f"{steady_ms:.1f} ({100 * steady_ms / step_ms:.1f}%)",
                f"{summary['tokens_per_s']:,.0f}",
            ]
        )
        commands.append("dtrain launch " + " ".join(args))
    same = all(curves[w] == curves[0] for w in WORKERS)
    micro = 16
    return Section(
        title="Data loading: a slow dataset with DataLoader workers",
        what=(
            "gpt_tiny with 2 layers and context 64, one process, `data=custom` over "
            "`tests/own_data.py:Pairs` sleeping "
            f"{SLEEP_MS:g} ms per item ({micro} items a step: {micro * SLEEP_MS:g} ms of "
            f"loading per step when read in the training process), {steps} steps. Data wait: "
            "the loop's time in `Batches.micro_batch` per step, averaged over all steps "
            "(the loader's start included: its first batch waits for a whole batch's "
            "loading), and steady: the median of the logging windows after the first "
            "(`data_wait_ms` in metrics.jsonl); step time: median over the logging windows "
            "after the first. Target: data wait < 5% of the step with workers."
        ),
        table=markdown_table(
            [
                "num_workers",
                "step ms",
                "data wait ms/step, all steps (share)",
                "data wait ms/step, steady (share)",
                "tokens/s",
            ],
            rows,
        ),
        commands=commands,
        notes=[
            "The loss curves of the three runs are "
            + ("identical (bitwise)." if same else "NOT identical: a bug."),
            "On this 2-core machine the workers only sleep, so they take no CPU from training.",
        ],
    )
