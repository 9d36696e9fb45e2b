"""The baseline: a hand-written DDP training loop, started with plain ``torchrun``.

    torchrun --standalone --nproc-per-node 2 bench/plain_ddp.py --steps 60 --timed-from 10

What a user would write without dtrain, on the same workload as ``dtrain launch``
(:mod:`loop_common`: the same model class, global sample stream and per-rank batch layout,
AdamW param groups, warmup + cosine schedule, global-norm clipping, DDP options and
threads per process). No config system, no metrics sink, no progress.

Rank 0 prints one JSON line (:func:`loop_common.result_record`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from loop_common import (
    Timings,
    Workload,
    make_optimizer,
    make_scheduler,
    parse_args,
    result_record,
    step_profiler,
)
from torch.nn.parallel import DistributedDataParallel as DDP


def train(args: Any, times: Timings) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.hf_model:  # the same loop over a transformers causal LM (bench/hf_workload.py)
        from hf_workload import HFWorkload

        work: Workload = HFWorkload(args, rank, world)
    elif args.custom_model:  # the same loop over a model class of one's own
        from custom_workload import CustomWorkload

        work = CustomWorkload(args, rank, world)
    else:
        work = Workload(args, rank, world)
    times.dtrain_imported = work.imported_at
    model = work.model
    params = [p for p in model.parameters() if p.requires_grad]
    # one process (the GPU benchmark): no DDP, as dtrain does not wrap a dp=1 model
    ddp = (
        DDP(model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True)
        if world > 1
        else model
    )
    opt = make_optimizer(model, args)
    sched = make_scheduler(opt, args)
    times.model_ready = time.time()
    loss = torch.zeros(())
    profiler = step_profiler(args, rank, work.device)
    for step in range(args.steps):
        profiler.step_begins(step + 1)
        for k in range(args.grad_accum):
            last = k == args.grad_accum - 1
            with contextlib.nullcontext() if last or world == 1 else ddp.no_sync():
                loss = work.loss(ddp, work.batch(step, k)) / args.grad_accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        times.step_done(step, args, loss, log=rank == 0)
        profiler.step_ends(step + 1)
        if step + 1 == args.timed_from and work.device.type == "cuda":
            torch.cuda.synchronize()
            times.timed_start = time.perf_counter()
    if work.device.type == "cuda":
        torch.cuda.synchronize()
    times.timed_end = time.perf_counter()
    return {"param_sum": work.param_sum(), "final_loss": loss.item()}


def main() -> None:
    times = Timings(torch_imported=time.time())
    args = parse_args(__doc__.splitlines()[0])
    torch.set_num_threads(args.threads)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    times.process_group_ready = time.time()
    try:
        result = train(args, times)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) != 0:
        return
    world = int(os.environ["WORLD_SIZE"])
    print(json.dumps(result_record("plain_ddp", args, times, world, **result)), flush=True)


if __name__ == "__main__":
    main()
