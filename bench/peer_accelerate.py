"""Peer: Hugging Face accelerate, started by ``accelerate launch``.

    bench/.venv-peers/bin/accelerate launch --multi_gpu --cpu --num_processes 2 \
        bench/peer_accelerate.py --steps 60 --timed-from 10

The loop of :mod:`plain_ddp` written the accelerate way: ``Accelerator`` with the same DDP
options (``DistributedDataParallelKwargs``), ``accelerator.prepare``,
``accelerator.backward``, ``accelerator.clip_grad_norm_``. Same model, data and schedule
(:mod:`loop_common`). Runs in the bench environment only (``make bench-peers-env``).
"""

from __future__ import annotations

import contextlib
import json
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs
from loop_common import Timings, Workload, make_optimizer, make_scheduler, parse_args, result_record


def main() -> None:
    times = Timings(torch_imported=time.time())
    args = parse_args(__doc__.splitlines()[0])
    ddp = DistributedDataParallelKwargs(
        bucket_cap_mb=int(args.bucket_mb), gradient_as_bucket_view=True
    )
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ddp])
    torch.set_num_threads(args.threads)
    times.process_group_ready = time.time()
    rank, world = accelerator.process_index, accelerator.num_processes
    work = Workload(args, rank, world)
    times.dtrain_imported = work.imported_at
    opt = make_optimizer(work.model, args)
    model, opt = accelerator.prepare(work.model, opt)
    sched = make_scheduler(opt.optimizer, args)
    times.model_ready = time.time()
    loss = torch.zeros(())
    for step in range(args.steps):
        for k in range(args.grad_accum):
            last = k == args.grad_accum - 1
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                loss = work.loss(model, work.batch(step, k)) / args.grad_accum
                accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        times.step_done(step, args, loss, log=rank == 0)
    times.timed_end = time.perf_counter()
    if rank == 0:
        result = {"param_sum": work.param_sum(), "final_loss": loss.item()}
        print(json.dumps(result_record("accelerate", args, times, world, **result)), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
