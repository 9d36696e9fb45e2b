"""The conv + BatchNorm classifier of :mod:`.spec`: the smallest model where BatchNorm
statistics matter (synchronized BatchNorm: :mod:`dtrain_cli.runtime.parallel.sync_batchnorm`)."""

from __future__ import annotations

import torch
from torch import nn

from dtrain_cli.models.cnn.config import CNNConfig


class ConvBNNet(nn.Module):
    """conv 3x3 + BatchNorm + ReLU blocks (stride 2 after the first), global average
    pooling and a linear classifier."""

    def __init__(self, cfg: CNNConfig) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        c_in = 3
        for i, c in enumerate(cfg.channels):
            blocks += [
                nn.Conv2d(c_in, c, 3, stride=1 if i == 0 else 2, padding=1),
                nn.BatchNorm2d(c),
                nn.ReLU(),
            ]
            c_in = c
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, cfg.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))
