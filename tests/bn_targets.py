"""Models with BatchNorm and their data, for tests/launch/test_sync_batchnorm.py: a user's own MLP
with BatchNorm1d, and images for a Hugging Face ResNet (BatchNorm2d) built by ``_target_``."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class BNNet(nn.Module):
    """Linear -> BatchNorm1d -> ReLU, twice, then a linear readout (a regression head). The
    linears before BatchNorm have no bias, as usual: BatchNorm removes it (its gradient is
    rounding noise, which Adam would blow up to full-size steps)."""

    def __init__(self, in_dim: int = 16, width: int = 32, out_dim: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(in_dim, width, bias=False),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Linear(width, width, bias=False),
            nn.BatchNorm1d(width),
            nn.ReLU(),
        )
        self.readout = nn.Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(self.body(x))


class Images(Dataset):
    """``n`` random 3 x size x size images, each labelled by its brightest colour channel."""

    def __init__(self, n: int = 256, size: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, size, size, generator=g) + 2 * torch.rand(
            n, 3, 1, 1, generator=g
        )
        self.y = self.x.mean(dim=(2, 3)).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]
