"""The pytorch-examples shape: ``init_process_group(init_method="env://")``, ``sys.exit()`` last.

torchrun --nproc-per-node 2 env_init_exit.py out
"""

import sys

import torch
import torch.distributed as dist
from report import write
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def demo_basic(out: str) -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    torch.manual_seed(42)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    torch.manual_seed(rank)
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(torch.randn(20, 10)), torch.randn(20, 5))
        loss.backward()
        opt.step()
    print(f"Finished running basic DDP example on rank {rank}.", flush=True)
    write(out, loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic(sys.argv[1])
    sys.exit()
