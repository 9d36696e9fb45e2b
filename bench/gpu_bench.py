"""The GPU benchmark: tokens/s and MFU of dtrain against a plain loop, bf16, one GPU.

    .venv/bin/python bench/gpu_bench.py --out $OUT          # on a machine with a GPU
    .venv/bin/python bench/gpu_bench.py --smoke             # the same plumbing on the CPU

For gpt_small and a ~350M-parameter GPT (24 layers, width 1024, context 1024), with and
without ``torch.compile`` (per block): ``dtrain launch ... dp=1 precision=bf16`` (NCCL,
CUDA) and the plain loop (``bench/plain_ddp.py`` under torchrun, one process, the same
model class, synthetic data, AdamW, schedule and bf16 autocast), alternately, in one call.
Tokens/s over the steps after the warm-up (dtrain: its summary's median over logging
windows; plain: the timed steps, CUDA-synchronized); MFU = tokens/s x FLOPs per token
(6 N + 12 L d T, from dtrain's plan.yaml) / the GPU's dense bf16 peak (``--peak-tflops``,
default from the device name). Prints a markdown table and writes it with the raw JSON
to ``--out``; the figures go into bench/RESULTS.md by hand. CPU tests stay the ground truth.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from programs import plain_args_from_run  # noqa: E402

BIN = Path(sys.executable).parent
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
COMMON = [
    "dp=1",
    "data=synthetic",
    "train.eval_every=0",
    "train.eval_batches=1",
    "logging.tensorboard=false",
    "logging.progress=lines",
    "checkpoint.every_steps=0",
]
MODELS = {
    "gpt_small": ["recipe=gpt_small", "train.global_batch_size=32", "train.micro_batch_size=32"],
    "gpt_350m": [
        "recipe=gpt_small",
        "model.n_layer=24",
        "model.n_embd=1024",
        "model.n_head=16",
        "model.block_size=1024",
        "train.global_batch_size=16",
        "train.micro_batch_size=16",
    ],
}
SMOKE = {
    "gpt_tiny": [
        "recipe=gpt_tiny",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.n_head=2",
        "model.block_size=32",
        "train.global_batch_size=4",
        "train.micro_batch_size=4",
    ]
}


def peak_tflops(arg: float | None) -> tuple[float, str]:
    if arg:
        return arg, "given"
    try:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        name = "cpu"
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in name:
            return value, name
    return float("nan"), name


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> str:
    print("$ " + shlex.join(argv), flush=True)
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {shlex.join(argv)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def dtrain_once(label: str, overrides: list[str], work: Path, env: dict, timeout: float) -> dict:
    name = f"{label}-{time.time_ns()}"
    argv = [str(BIN / "dtrain"), "launch", *overrides, f"run.root={work}", f"run.name={name}"]
    run(argv, env, work, timeout)
    run_dir = work / name
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    return {"run_dir": str(run_dir), "summary": summary, "plan": plan, "command": argv}


def plain_once(run_dir: Path, steps: int, timed_from: int, env: dict, timeout: float) -> dict:
    args = plain_args_from_run(run_dir)
    argv = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "1",
        str(REPO / "bench" / "plain_ddp.py"),
        *args,
        "--steps",
        str(steps),
        "--timed-from",
        str(timed_from),
        "--log-every",
        str(timed_from),
    ]
    out = run(argv, env, run_dir.parent, timeout)
    line = next(x for x in reversed(out.splitlines()) if x.startswith('{"bench"'))
    return {**json.loads(line), "command": argv}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="folder for gpu_results.md/.json")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20, help="steps left out of tokens/s")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--models", nargs="*", default=None)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument("--smoke", action="store_true", help="CPU, fp32, a tiny model: plumbing")
    p.add_argument("--timeout", type=float, default=900.0)
    a = p.parse_args(argv)
    models = SMOKE if a.smoke else MODELS
    if a.models:
        models = {k: v for k, v in models.items() if k in a.models}
    precision = [] if a.smoke else ["precision=bf16", "run.device=cuda"]
    steps, warmup = (6, 2) if a.smoke else (a.steps, a.warmup)
    peak, device = peak_tflops(a.peak_tflops)
    work = Path(tempfile.mkdtemp(prefix="dtrain-gpu-bench-"))
    # steady tokens/s and MFU only: no warm worker pool left running on the lent machine
    env = {**os.environ, "DTRAIN_CACHE": str(work / "cache"), "DTRAIN_WARM_POOL": "0"}
    rows, raw = [], []
    for model, model_overrides in models.items():
        for compiled in (False,) if a.no_compile or a.smoke else (False, True):
            overrides = [
                *model_overrides,
                *COMMON,
                *precision,
                f"train.steps={steps}",
                f"optim.warmup_steps={min(10, warmup)}",
                f"logging.every={warmup}",
                f"train.compile={str(compiled).lower()}",
            ]
            label = f"{model}{'-compiled' if compiled else ''}"
            d = dtrain_once(label, overrides, work, env, a.timeout)
            pl = plain_once(Path(d["run_dir"]), steps, warmup, env, a.timeout)
            flops = d["plan"]["estimates"]["flops_per_token"]
            d_tps, p_tps = d["summary"]["tokens_per_s"], pl["tokens_per_s"]
            params = d["plan"]["estimates"]["num_params"]
            rows.append(
                [
                    model,
                    f"{params / 1e6:.1f}M",
                    "yes" if compiled else "no",
                    f"{d_tps:,.0f}",
                    f"{p_tps:,.0f}",
                    f"{d_tps / p_tps:.3f}",
                    f"{100 * d_tps * flops / (peak * 1e12):.1f}%",
                    f"{100 * p_tps * flops / (peak * 1e12):.1f}%",
                ]
            )
            raw.append({"label": label, "dtrain": d, "plain": pl, "flops_per_token": flops})
            print(" | ".join(rows[-1]), flush=True)
    headers = [
        "model",
        "params",
        "torch.compile",
        "dtrain tokens/s",
        "plain tokens/s",
        "dtrain / plain",
        "dtrain MFU",
        "plain MFU",
    ]
    table = "\n".join(
        [
            f"Device: {device}; bf16 peak {peak:g} TFLOPS; steps {warmup + 1}-{steps} of {steps}.",
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(r) + " |" for r in rows),
        ]
    )
    print(table)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "gpu_results.md").write_text(table + "\n")
        (a.out / "gpu_results.json").write_text(json.dumps(raw, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
