"""Benchmark ``hf``: the tiny Hugging Face Llama under ``dtrain launch`` against plain torchrun
+ DDP over the same transformers model and data (``plain_ddp.py --hf-model``).

    .venv/bin/python bench/run.py --only hf

Both programs build ``AutoModelForCausalLM.from_config`` under the same seed and train on the
same sample stream with the model's own loss; the plain flags come from dtrain's run dir as
for ``overhead``. Steady tokens/s over the timed steps and the time from the command's start
to the end of optimizer step 1, from the same runs.
"""

from __future__ import annotations

from harness import EN_DASH, Section, Workspace, markdown_table, spread
from programs import Workload
from throughput import _commands, _fmt_ratio, _fmt_tps, measure


def hf_overhead(ws: Workspace) -> Section:
    steps, rounds = (20, 2) if ws.quick else (60, 3)
    work = Workload("llama_tiny_hf", "llama_tiny_hf", steps, 10, 10)
    res = measure(ws, work, rounds)
    first_ratios = res.pick(
        [d / p for d, p in zip(res.dtrain_first_s, res.plain_first_s, strict=True)]
    )
    row = [
        f"{work.timed_from + 1}{EN_DASH}{work.steps} of {work.steps}",
        res.rounds_label(),
        spread(res.tps(res.dtrain_ms), _fmt_tps),
        spread(res.tps(res.plain_ms), _fmt_tps),
        spread(res.ratios(), _fmt_ratio),
        "≥ 0.98",
        spread(res.pick(res.dtrain_first_s), lambda x: f"{x:.2f}"),
        spread(res.pick(res.plain_first_s), lambda x: f"{x:.2f}"),
        spread(first_ratios, _fmt_ratio),
        res.same_params(),
    ]
    headers = [
        "timed steps",
        "rounds used",
        "dtrain tokens/s",
        "plain tokens/s",
        "dtrain / plain tokens/s",
        "target",
        "dtrain end of step 1, s",
        "plain end of step 1, s",
        "dtrain / plain time to first step",
        "same final params",
    ]
    return Section(
        title="HF. The tiny HF Llama: `dtrain launch recipe=llama_tiny_hf dp=2` vs torchrun + DDP",
        what=(
            "`recipes/llama_tiny_hf.yaml` (a transformers Llama built from its config, 0.85M "
            "parameters, train.loss=model) against `bench/plain_ddp.py --hf-model` "
            "(`bench/hf_workload.py`: `AutoModelForCausalLM.from_config` under the same seed, "
            "`model(input_ids=x, labels=y, shift_labels=y).loss`, the same sample stream, "
            "AdamW, schedule, clipping and DDP options). Tokens/s over the timed steps as in "
            "section 1; time to first step from the command's start (`DTRAIN_LAUNCH_T0` / "
            "`BENCH_T0`) to the end of optimizer step 1, data cache warm. Median "
            f"(min{EN_DASH}max) over the rounds used; ratios round by round."
        ),
        table=markdown_table(headers, [row]),
        commands=_commands([res]),
    )
