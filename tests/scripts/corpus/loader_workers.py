"""Module-level training code, no ``__main__`` guard (the nanoGPT shape), with DataLoader
workers: each rank's loader forks its workers as a fresh python would.

    torchrun --nproc-per-node 2 loader_workers.py out
"""

import os
import sys

import torch
import torch.distributed as dist
from report import write
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Squares(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        x = torch.tensor([i / 256.0, (i % 7) / 7.0])
        return x, (x**2).sum(dim=0, keepdim=True)


out = sys.argv[1]
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sampler = DistributedSampler(Squares(), shuffle=True, seed=0)
loader = DataLoader(Squares(), batch_size=16, sampler=sampler, num_workers=2)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
write(out, loss.item(), pid=os.getpid())
dist.destroy_process_group()
