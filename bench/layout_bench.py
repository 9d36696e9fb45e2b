"""Model-parallel and data-parallel strategy benchmarks (issues: pipeline bubble, ZeRO/FSDP
memory, compression bytes, local SGD), read from dtrain's own run summaries.

    .venv/bin/python bench/run.py --only pipeline --only strategies

On 2 cores absolute speed-ups from more processes are not expected; the figures of merit
are the measured bubble against theory, bytes per rank against full/dp, and bytes moved.
"""

from __future__ import annotations

import json
import subprocess

from harness import BIN, Section, Workspace, log, markdown_table

COMMON = [
    "logging.tensorboard=false",
    "logging.progress=lines",
    "checkpoint.at_end=false",
    "train.eval_every=0",
    "train.eval_batches=1",
    "optim.warmup_steps=0",
]


def launch(ws: Workspace, args: list[str]) -> dict:
    name = ws.next_name("layout")
    cmd = [str(BIN / "dtrain"), "launch", *args, *COMMON, f"run.root={ws.runs}", f"run.name={name}"]
    proc = subprocess.run(
        cmd, cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads((ws.runs / name / "summary.json").read_text())


def pipeline_bench(ws: Workspace) -> Section:
    steps = 4 if ws.quick else 6
    base = [
        "recipe=gpt_small",
        f"train.steps={steps}",
        "logging.every=2",
        "train.global_batch_size=16",
    ]
    runs: list[tuple[str, list[str]]] = [("dp=2 (reference)", ["dp=2"]), ("tp=2", ["tp=2"])]
    micro = {2: 8, 4: 4, 8: 2}
    schedules = {
        "gpipe": [],
        "1f1b": [],
        "interleaved_1f1b": ["pipeline.virtual_stages=2"],
        "zbv": ["pipeline.virtual_stages=2"],
    }
    for sched, extra in schedules.items():
        for m, mb in micro.items():
            if sched == "1f1b" and m < 2:
                continue
            runs.append(
                (
                    f"pp=2 {sched}, {m} micro-batches",
                    ["pp=2", f"pipeline.schedule={sched}", f"train.micro_batch_size={mb}", *extra],
                )
            )
    if ws.quick:
        runs = runs[:4]
    rows = []
    for label, args in runs:
        log(f"pipeline: {label}")
        s = launch(ws, [*base, *args])
        theory = s.get("bubble_theory")
        measured = s.get("bubble_measured")
        rows.append(
            [
                label,
                f"{s['tokens_per_s']:,.0f}",
                "-" if theory is None else f"{theory:.1%}",
                "-" if measured is None else f"{measured:.1%}",
                ", ".join(f"{b:.0%}" for b in s.get("bubble_measured_per_pp_rank", [])),
            ]
        )
    return Section(
        "Pipeline and tensor parallel on gpt_small: tokens/s and bubble",
        f"gpt_small, global batch 16, {steps} steps (tokens/s: median of logging windows after "
        "the first). Theory: (p-1)/(v*m+p-1). Measured: 1 - CPU busy time / step wall time "
        "per pp rank (CPU only). On 2 cores, 2 processes compete with the elastic agent and "
        "small micro-batches pay gloo's per-message latency, so the figure of merit is "
        "measured bubble against theory, not speed-up.",
        markdown_table(
            ["layout", "tokens/s", "bubble theory", "bubble measured", "per pp rank"], rows
        ),
        commands=[
            f"dtrain launch {' '.join(base)} pp=2 pipeline.schedule=1f1b "
            "train.micro_batch_size=4 " + " ".join(COMMON)
        ],
    )


def strategy_bench(ws: Workspace) -> Section:
    tiny = ["recipe=gpt_tiny", "train.global_batch_size=16"]
    rows_mem = []
    for dp in (2, 4):
        full = None
        for strategy in ("ddp", "zero1", "fsdp"):
            log(f"strategies: memory {strategy} dp={dp}")
            s = launch(
                ws,
                [
                    *tiny,
                    f"dp={dp}",
                    "train.steps=2",
                    f"parallel.strategy={strategy}",
                    "logging.every=1",
                ],
            )
            opt = s["memory_optimizer_bytes"]["measured"]
            full = full or opt
            rows_mem.append(
                [
                    f"{strategy}, dp={dp}",
                    f"{opt:,}",
                    f"{opt / full:.3f}",
                    f"{1 / dp if strategy != 'ddp' else 1:.3f}",
                    f"{s['memory_params_bytes']['measured']:,}",
                ]
            )
    rows_comm = []
    steps = 20 if ws.quick else 40
    variants = {
        "none": [],
        "fp16": ["comm.compression=fp16"],
        "bf16": ["comm.compression=bf16"],
        "powersgd rank 1": [
            "comm.compression=powersgd",
            "comm.powersgd_rank=1",
            "comm.powersgd_start_iter=2",
        ],
        "powersgd rank 4": [
            "comm.compression=powersgd",
            "comm.powersgd_rank=4",
            "comm.powersgd_start_iter=2",
        ],
        "local SGD every 1": ["sync.mode=local_sgd", "sync.every=1"],
        "local SGD every 8": ["sync.mode=local_sgd", "sync.every=8"],
    }
    for label, extra in variants.items():
        log(f"strategies: {label}")
        s = launch(ws, [*tiny, "dp=2", f"train.steps={steps}", "logging.every=10", *extra])
        rows_comm.append(
            [
                label,
                f"{s['comm_bytes_per_step_estimate']:,}",
                f"{s['tokens_per_s']:,.0f}",
                f"{s['final_loss']:.4f}",
            ]
        )
    table = (
        markdown_table(
            [
                "strategy",
                "optimizer-state bytes per rank (measured)",
                "/ ddp",
                "target 1/dp (<= x1.05)",
                "parameter bytes per rank",
            ],
            rows_mem,
        )
        + "\n\n"
        + markdown_table(
            [
                "gradient sync (dp=2)",
                "bytes sent per rank per step (plan)",
                "tokens/s",
                f"loss after {steps} steps",
            ],
            rows_comm,
        )
    )
    return Section(
        "ZeRO / FSDP memory, gradient compression, local SGD",
        "gpt_tiny with AdamW, global batch 16. Memory: bytes of optimizer state and parameters "
        "each rank holds after the first step (dtrain's measurement in summary.json). "
        "Communication: the plan's bytes per rank per step (ring) for each option; tokens/s "
        "and the loss they reach on the same data.",
        table,
    )
