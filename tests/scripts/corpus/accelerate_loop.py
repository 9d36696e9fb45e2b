"""A plain loop made distributed by accelerate (``Accelerator().prepare``).

torchrun --nproc-per-node 2 accelerate_loop.py --out out
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from report import write
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    x = torch.randn(96, 4)
    loader = DataLoader(
        TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])),
        batch_size=8,
        shuffle=True,
    )
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loss = None
    for _ in range(2):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
    accelerator.print(f"final loss {loss.item():.6f}")
    write(args.out, loss.item(), world=accelerator.num_processes)


if __name__ == "__main__":
    main()
