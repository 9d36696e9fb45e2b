"""The advisor's estimates against measurement: step time and memory of gpt_small's CPU
layouts (``dtrain advise``'s step-time model, calibrated where it can be).

    .venv/bin/python bench/run.py --only advise

Each layout runs as a real ``dtrain launch``; its estimate is what ``dtrain advise
hardware=cpu`` computes for the same config (imported torch-free from dtrain_cli.plan).
Measured step time: tokens per step / the run's median tokens/s (logging windows after
the first); measured memory: rank 0's parameter + optimizer bytes (summary.json).
"""

from __future__ import annotations

import sys

from harness import REPO, Section, Workspace, log, markdown_table
from layout_bench import COMMON, launch

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LAYOUTS: list[tuple[str, list[str]]] = [
    ("dp=2 ddp", ["dp=2"]),
    ("dp=2 zero1", ["dp=2", "parallel=zero1"]),
    ("dp=2 fsdp", ["dp=2", "parallel=fsdp"]),
    ("tp=2", ["tp=2"]),
    ("pp=2 gpipe", ["pp=2", "pipeline.schedule=gpipe", "train.micro_batch_size=4"]),
    ("pp=2 1f1b", ["pp=2", "pipeline.schedule=1f1b", "train.micro_batch_size=4"]),
    (
        "pp=2 interleaved_1f1b v2",
        [
            "pp=2",
            "pipeline.schedule=interleaved_1f1b",
            "pipeline.virtual_stages=2",
            "train.micro_batch_size=4",
        ],
    ),
    (
        "pp=2 zbv",
        ["pp=2", "pipeline.schedule=zbv", "pipeline.virtual_stages=2", "train.micro_batch_size=4"],
    ),
    ("dp=2 ddp, checkpointing selective", ["dp=2", "parallel.activation_checkpointing=selective"]),
    ("dp=2 ddp, checkpointing full", ["dp=2", "parallel.activation_checkpointing=full"]),
    (
        "pp=2 1f1b, checkpointing full",
        ["pp=2", "train.micro_batch_size=4", "parallel.activation_checkpointing=full"],
    ),
]


def estimate(args: list[str]):
    from dtrain_cli.config.compose import compose_config, split_recipe
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.build import Resources, build_plan
    from dtrain_cli.plan.steptime import estimate_step

    recipe, rest = split_recipe(args)
    cfg = compose_config(recipe, [*rest, "hardware=cpu"], validate=False)
    plan = build_plan(cfg, Resources(num_gpus=0, num_cpus=2))
    return plan, estimate_step(cfg, model_spec(cfg), plan, cfg.hardware)


def advise_bench(ws: Workspace) -> Section:
    steps = 4  # few steps: the estimate is per step, one window after the first is enough
    base = ["recipe=gpt_small", f"train.steps={steps}", "logging.every=2"]
    base.append("train.global_batch_size=16")
    layouts = LAYOUTS[:3] if ws.quick else LAYOUTS
    rows, commands = [], []
    for label, extra in layouts:
        log(f"advise: {label}")
        args = [*base, *extra]
        plan, est = estimate(args)
        s = launch(ws, args)
        step_measured = plan.batch.tokens_per_step / s["tokens_per_s"]
        mem_measured = (
            s["memory_params_bytes"]["measured"] + s["memory_optimizer_bytes"]["measured"]
        )
        mem_est = est.memory.params + est.memory.optimizer
        rows.append(
            [
                label,
                f"{est.step_s:.2f}",
                f"{step_measured:.2f}",
                f"{est.step_s / step_measured:.2f}",
                f"{mem_est / 2**20:.1f}",
                f"{mem_measured / 2**20:.1f}",
                f"{mem_est / mem_measured:.2f}",
                f"{est.memory.activations / 2**20:.1f}",
            ]
        )
        commands.append(" ".join(["dtrain launch", *args, *COMMON]))
    table = markdown_table(
        [
            "layout",
            "step s (est.)",
            "step s (measured)",
            "est/measured",
            "params+optim MiB (est.)",
            "measured",
            "est/measured",
            "activations MiB (est., peak)",
        ],
        rows,
    )
    return Section(
        title="Advisor estimates against measurement (gpt_small, CPU layouts)",
        what=(
            f"gpt_small, global batch 16, {steps} steps; estimate = `dtrain advise hardware=cpu`'s "
            "step-time model for the same config (configs/hardware/cpu.yaml). Measured step = "
            "tokens per step / median tokens/s; memory = rank 0's parameter + optimizer bytes "
            "from summary.json (activations are measured exactly in "
            "tests/unit/test_activation_checkpoint.py, not at run time)."
        ),
        table=table,
        commands=commands[:1],
        notes=[
            "The step-time model has no term for what 2 shared cores add: gloo's collectives "
            "and the pipeline's sends take CPU from compute rather than overlapping it, and "
            "the elastic agent and other jobs compete for the same cores.",
        ],
    )
