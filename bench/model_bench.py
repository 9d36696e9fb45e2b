"""Benchmarks ``hf`` and ``custom``: a Hugging Face model and a model of the user's own under
``dtrain launch``, each against plain torchrun + DDP over the same model and data
(``plain_ddp.py --hf-model`` / ``--custom-model``).

    .venv/bin/python bench/run.py --only hf --only custom

Both programs build the same model under the same seed and train on the same sample stream;
the plain flags come from dtrain's run dir as for ``overhead``. Steady tokens/s over the
timed steps and the time from the command's start to the end of optimizer step 1, from the
same runs.
"""

from __future__ import annotations

from harness import EN_DASH, REPO, Section, Workspace, markdown_table, spread
from programs import Workload
from throughput import CPU_NOTE, Rounds, _commands, _fmt_ratio, _fmt_tps, cpu_table, measure

OWN_MODEL = REPO / "bench" / "own_model"
HEADERS = [
    "timed steps",
    "rounds used",
    "dtrain tokens/s",
    "plain tokens/s",
    "dtrain / plain tokens/s",
    "target",
    "dtrain end of step 1, s",
    "plain end of step 1, s",
    "dtrain / plain time to first step",
    "target",
    "same final params",
]
HOW = (
    "Tokens/s over the timed steps as in section 1; time to first step from the command's "
    "start (`DTRAIN_LAUNCH_T0` / `BENCH_T0`) to the end of optimizer step 1, data cache warm. "
    f"Median (min{EN_DASH}max) over the rounds used; ratios round by round."
)


def hf_overhead(ws: Workspace) -> Section:
    return _versus_plain(
        ws,
        "llama_tiny_hf",
        (),
        title="HF. The tiny HF Llama: `dtrain launch recipe=llama_tiny_hf dp=2` vs torchrun + DDP",
        what=(
            "`recipes/llama_tiny_hf.yaml` (a transformers Llama built from its config, 0.85M "
            "parameters, train.loss=model) against `bench/plain_ddp.py --hf-model` "
            "(`bench/hf_workload.py`: `AutoModelForCausalLM.from_config` under the same seed, "
            "`model(input_ids=x, labels=y, shift_labels=y).loss`, the same sample stream, "
            "AdamW, schedule, clipping and DDP options). " + HOW
        ),
    )


def custom_overhead(ws: Workspace) -> Section:
    return _versus_plain(
        ws,
        "own_lm",
        ("--config-dir", str(OWN_MODEL)),
        title=(
            "Custom. A model of your own: `dtrain launch recipe=own_lm --config-dir "
            "bench/own_model dp=2` vs torchrun + DDP"
        ),
        what=(
            "`bench/own_model/own_lm.py` (`OwnLM`, a 4-block causal transformer written in "
            "plain PyTorch, 0.8M parameters, gpt_tiny's size) as `model=custom "
            "model._target_=own_lm.OwnLM` on the built-in token data, against "
            "`bench/plain_ddp.py --custom-model` (`bench/custom_workload.py`: the same class "
            "imported from the run's import roots and built under the same seed, next-token "
            "cross entropy, the same sample stream, AdamW, schedule, clipping and DDP "
            "options). dtrain's plan builds the class on the meta device to count it and on "
            "fake tensors to measure its activations (a torch import in the launcher; kept "
            "in the data cache after the first plan). " + HOW
        ),
    )


def _versus_plain(
    ws: Workspace, recipe: str, overrides: tuple[str, ...], title: str, what: str
) -> Section:
    """The recipe under dtrain against the plain loop on the same model: one table row."""
    steps, rounds = (20, 2) if ws.quick else (60, 5)  # 5 rounds: as section 1's gpt_tiny
    if ws.rounds:  # --rounds: more and longer rounds, where the default ones disagree
        steps, rounds = 200, ws.rounds
    res = measure(ws, Workload(recipe, recipe, steps, 10, 10, overrides), rounds)
    table = markdown_table(HEADERS, [_row(res)])
    table += f"\n\nThe same runs in CPU time: {CPU_NOTE}\n\n{cpu_table([res])}"
    return Section(title=title, what=what, table=table, commands=_commands([res]))


def _row(res: Rounds) -> list[str]:
    work = res.work
    first_ratios = res.pick(
        [d / p for d, p in zip(res.dtrain_first_s, res.plain_first_s, strict=True)]
    )
    return [
        f"{work.timed_from + 1}{EN_DASH}{work.steps} of {work.steps}",
        res.rounds_label(),
        spread(res.tps(res.dtrain_ms), _fmt_tps),
        spread(res.tps(res.plain_ms), _fmt_tps),
        spread(res.ratios(), _fmt_ratio),
        "≥ 0.98",
        spread(res.pick(res.dtrain_first_s), lambda x: f"{x:.2f}"),
        spread(res.pick(res.plain_first_s), lambda x: f"{x:.2f}"),
        spread(first_ratios, _fmt_ratio),
        "≤ 0.7",
        res.same_params(),
    ]
