"""A plain DDP training script, written the torchrun way (no dtrain import).

    torchrun --standalone --nproc-per-node 2 tests/scripts/ddp_plain.py --steps 5 --out p.json
    dtrain run dp=2 -- tests/scripts/ddp_plain.py --steps 5 --out p.json

Rank 0 writes the final parameters (and when its first step finished) to --out; with
--dump DIR every rank writes what it saw (environment, argv, __name__, __file__,
sys.path[0], a value imported from the module next to it, how many objects
the garbage collector tracks). Used by tests/launch/test_script_run.py
and bench/script_bench.py.
"""

import argparse
import gc
import json
import os
import sys
import time

import ddp_data  # next to this script: sys.path[0] is this folder, as under python
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dump", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        seen = {
            "env": dict(os.environ),
            "argv": sys.argv,
            "name": __name__,
            "file": __file__,
            "path0": sys.path[0],
            "imported": ddp_data.MARKER,
            "main_is_module": sys.modules["__main__"].__dict__ is globals(),
            "gc_scanned": len(gc.get_objects()),  # what a full collection walks
        }
        with open(os.path.join(args.dump, f"rank_{rank}.json"), "w") as f:
            json.dump(seen, f)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    first_step = None
    for step in range(args.steps):
        x, y = ddp_data.batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if first_step is None:
            first_step = time.time()
            print(f"first step done at {first_step:.3f}", flush=True)
    if rank == 0:
        params = [p.detach().flatten().tolist() for p in model.module.parameters()]
        with open(args.out, "w") as f:
            json.dump({"params": params, "world": world, "first_step": first_step}, f)
    # DDP's reducer must not drop the last reference to the gloo group: its destructor
    # holds the GIL while joining gloo's thread, which may wait for the GIL (seen to hang)
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
