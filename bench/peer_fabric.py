"""Peer: Lightning Fabric, started by its own launcher (``python bench/peer_fabric.py``).

    bench/.venv-peers/bin/python bench/peer_fabric.py --nproc 2 --steps 60 --timed-from 10

The loop of :mod:`plain_ddp` written the Fabric way: ``Fabric(strategy=DDPStrategy(...))``
with the same DDP options, ``fabric.setup``, ``fabric.backward``,
``fabric.clip_gradients``. Same model, data and schedule (:mod:`loop_common`). Runs in the
bench environment only (``make bench-peers-env``); Lightning is never a dtrain dependency.
"""

from __future__ import annotations

import json
import time

import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy
from loop_common import Timings, Workload, make_optimizer, make_scheduler, parse_args, result_record


def main() -> None:
    times = Timings(torch_imported=time.time())
    args = parse_args(__doc__.splitlines()[0])
    strategy = DDPStrategy(
        process_group_backend="gloo",
        bucket_cap_mb=args.bucket_mb,
        gradient_as_bucket_view=True,
    )
    fabric = Fabric(accelerator="cpu", devices=args.nproc, strategy=strategy, precision="32-true")
    fabric.launch()  # starts the other ranks (its own launcher) and the process group
    torch.set_num_threads(args.threads)
    times.process_group_ready = time.time()
    work = Workload(args, fabric.global_rank, fabric.world_size)
    times.dtrain_imported = work.imported_at
    opt = make_optimizer(work.model, args)
    model, opt = fabric.setup(work.model, opt)
    sched = make_scheduler(opt.optimizer, args)
    times.model_ready = time.time()
    loss = torch.zeros(())
    for step in range(args.steps):
        for k in range(args.grad_accum):
            last = k == args.grad_accum - 1
            with fabric.no_backward_sync(model, enabled=not last):
                loss = work.loss(model, work.batch(step, k)) / args.grad_accum
                fabric.backward(loss)
        fabric.clip_gradients(model, opt, max_norm=args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        times.step_done(step, args, loss, log=fabric.global_rank == 0)
    times.timed_end = time.perf_counter()
    if fabric.global_rank == 0:
        result = {"param_sum": work.param_sum(), "final_loss": loss.item()}
        record = result_record("fabric", args, times, fabric.world_size, **result)
        print(json.dumps(record), flush=True)
        wait_for_other_ranks(fabric.strategy)


def wait_for_other_ranks(strategy: object) -> None:
    """Lightning's launcher starts the other ranks with ``subprocess.Popen`` and never waits
    for them; wait here, so the command ends when every rank has (and the benchmark's CPU
    accounting, which counts reaped children, sees their CPU time as the program's own)."""
    for proc in getattr(getattr(strategy, "launcher", None), "procs", []):
        proc.wait()


if __name__ == "__main__":
    main()
