"""A model and a dataset of your own, trained by dtrain without a line of dtrain in them.

    cd examples
    dtrain launch recipe=my_experiment --config-dir conf dp=2

``Net`` is a residual MLP regressor; ``Pairs`` gives (inputs, targets) pairs of a fixed
noisy linear map. Nothing here knows about dtrain: any ``nn.Module`` and any map-style
dataset will do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class Unit(nn.Module):
    """Pre-norm residual unit: norm -> widen -> GELU -> narrow."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, in_dim: int = 16, width: int = 64, depth: int = 4, out_dim: int = 4) -> None:
        super().__init__()
        self.stem = nn.Linear(in_dim, width)
        self.trunk = nn.ModuleList(Unit(width) for _ in range(depth))
        self.readout = nn.Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for unit in self.trunk:
            h = unit(h)
        return self.readout(h)


class Pairs(Dataset):
    """``n`` samples of y = W x + noise, the same for the same seed."""

    def __init__(self, n: int = 1024, in_dim: int = 16, out_dim: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, in_dim, generator=g)
        w = torch.randn(in_dim, out_dim, generator=g) / in_dim**0.5
        self.y = self.x @ w + 0.01 * torch.randn(n, out_dim, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]
