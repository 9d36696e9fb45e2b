"""The baseline: a hand-written DDP training loop, started with plain ``torchrun``.

    torchrun --standalone --nproc-per-node 2 bench/plain_ddp.py --steps 60 --timed-from 10

What a user would write without dtrain, on the same workload as ``dtrain launch``: the
same model class (``dtrain_cli.runtime.model.GPT``), the same global sample stream and
per-rank batch layout (``dtrain_cli.runtime.data``), AdamW with the same param groups,
betas, eps and weight decay, the same warmup + cosine schedule, global-norm clipping, the
same DDP options and threads per process. No config system, no metrics sink, no progress.

Rank 0 prints one JSON line: time of steps ``timed_from+1 .. steps`` (perf_counter), the
time from ``$BENCH_T0`` (epoch seconds, set by the caller just before starting torchrun)
to the end of step 1, and the final parameter sum (to check that both programs trained
the same thing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Timings:
    torch_imported: float
    dtrain_imported: float = math.nan
    process_group_ready: float = math.nan
    model_ready: float = math.nan
    first_step_done: float = math.nan
    timed_start: float = math.nan
    timed_end: float = math.nan


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--n-layer", type=int, default=4)
    add("--n-head", type=int, default=4)
    add("--n-embd", type=int, default=128)
    add("--block-size", type=int, default=128)
    add("--vocab-size", type=int, default=256)
    add("--data-source", default="builtin")
    add("--val-fraction", type=float, default=0.1)
    add("--micro-batch", type=int, default=8)
    add("--grad-accum", type=int, default=1)
    add("--steps", type=int, default=60)
    add("--timed-from", type=int, default=10, help="time the steps after this one")
    add("--seed", type=int, default=1337)
    add("--lr", type=float, default=1e-3)
    add("--min-lr", type=float, default=1e-4)
    add("--warmup-steps", type=int, default=10)
    add("--weight-decay", type=float, default=0.1)
    add("--betas", type=float, nargs=2, default=(0.9, 0.95))
    add("--eps", type=float, default=1e-8)
    add("--grad-clip", type=float, default=1.0)
    add("--bucket-mb", type=float, default=25.0)
    add("--threads", type=int, default=1)
    add("--log-every", type=int, default=10)
    return p.parse_args()


def lr_factor(step: int, args: argparse.Namespace) -> float:
    """Linear warmup, then cosine from ``lr`` to ``min_lr`` over the remaining steps."""
    if args.warmup_steps and step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
    lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr / args.lr


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=args.lr, betas=tuple(args.betas), eps=args.eps, foreach=True
    )


def train(args: argparse.Namespace, times: Timings) -> dict[str, Any]:
    # Imported here, after the process group, to time them apart from torch's import.
    from dtrain_cli.config.schema import DataConfig, ModelConfig
    from dtrain_cli.runtime.data import BatchLayout, SampleStream, open_splits
    from dtrain_cli.runtime.model import GPT, lm_loss

    times.dtrain_imported = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    mcfg = ModelConfig(
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        block_size=args.block_size,
        vocab_size=args.vocab_size,
    )
    windows = open_splits(
        DataConfig(source=args.data_source, val_fraction=args.val_fraction), mcfg, args.seed
    )["train"]
    stream = SampleStream(len(windows), args.seed)
    layout = BatchLayout(args.micro_batch, args.grad_accum, world, rank)
    torch.manual_seed(args.seed)
    model = GPT(mcfg)
    params = [p for p in model.parameters() if p.requires_grad]
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True)
    opt = make_optimizer(model, args)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args))
    times.model_ready = time.time()
    loss = torch.zeros(())
    for step in range(args.steps):
        for k in range(args.grad_accum):
            idx = stream.indices(layout.micro_start(step, k), args.micro_batch)
            t = torch.from_numpy(windows.gather(idx))
            last = k == args.grad_accum - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                loss = lm_loss(ddp(t[:, :-1]), t[:, 1:]) / args.grad_accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if step == 0:
            times.first_step_done = time.time()
        if step + 1 == args.timed_from:
            times.timed_start = time.perf_counter()
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
    times.timed_end = time.perf_counter()
    return {
        "param_sum": float(sum(p.detach().double().sum() for p in params)),
        "final_loss": loss.item(),
    }


def main() -> None:
    times = Timings(torch_imported=time.time())
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    times.process_group_ready = time.time()
    try:
        result = train(args, times)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) != 0:
        return
    t0 = float(os.environ.get("BENCH_T0", "nan"))
    timed_steps = args.steps - args.timed_from
    timed_s = times.timed_end - times.timed_start
    tokens_per_step = args.micro_batch * args.grad_accum * int(os.environ["WORLD_SIZE"])
    tokens_per_step *= args.block_size
    record = {
        "bench": "plain_ddp",
        "timed_steps": timed_steps,
        "timed_s": timed_s,
        "ms_per_step": 1000 * timed_s / timed_steps,
        "tokens_per_s": tokens_per_step * timed_steps / timed_s,
        "torch_imported_s": times.torch_imported - t0,
        "process_group_ready_s": times.process_group_ready - t0,
        "dtrain_imports_s": times.dtrain_imported - times.process_group_ready,
        "model_ready_s": times.model_ready - t0,
        "first_step_done_s": times.first_step_done - t0,
        **result,
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
