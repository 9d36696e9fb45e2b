"""A plain DDP training script, written the torchrun way: dtrain runs it unchanged.

    torchrun --standalone --nproc-per-node 2 examples/train.py --steps 20
    dtrain run dp=2 -- examples/train.py --steps 20

No line of dtrain in it. Two habits make it a good citizen of a cluster (docs/own-script.md):
it keeps a checkpoint in ``$DTRAIN_RUN_DIR`` (the run directory ``dtrain run`` names), and on
the preemption signal (SIGUSR1: SLURM's ``--signal``, or ``kill -USR1 <dtrain pid>``) every
rank agrees to stop, rank 0 saves, and all exit with code 75; started again (``dtrain
sbatch`` requeues the job by itself) it continues from that step.
"""

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

EXIT_PREEMPTED = 75  # dtrain: "checkpoint saved, run me again"
stop_requested = False


def request_stop(signum, frame):
    global stop_requested
    stop_requested = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    signal.signal(signal.SIGUSR1, request_stop)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")  # env://
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    run_dir = os.environ.get("DTRAIN_RUN_DIR")  # set by dtrain run; None under torchrun
    ckpt = os.path.join(run_dir, "ckpt.pt") if run_dir else None
    start = 0
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    w = torch.linspace(-1, 1, 16)
    preempted = False
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(step * dist.get_world_size() + rank)
        x = torch.randn(32, 16, generator=g)
        loss = nn.functional.mse_loss(model(x).squeeze(1), x @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1}  loss {loss.item():.4f}", flush=True)
        stop = torch.tensor(float(stop_requested))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if stop.item() and ckpt:
            if rank == 0:
                torch.save(
                    {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1},
                    ckpt,
                )
            dist.barrier()
            preempted = True
            break
    del model, opt  # DDP's last reference to the gloo group goes before the group does
    dist.destroy_process_group()
    if preempted:
        raise SystemExit(EXIT_PREEMPTED)


if __name__ == "__main__":
    main()
