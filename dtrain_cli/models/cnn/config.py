"""The built-in conv + BatchNorm classifier's config. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

KERNEL = 3


@dataclass(kw_only=True)
class CNNConfig:
    """conv 3x3 + BatchNorm + ReLU blocks, global average pooling, a linear classifier."""

    kind: str = "cnn_bn"
    name: str = "cnn_bn"
    channels: list[int] = field(default_factory=lambda: [16, 32])
    """Output channels of each conv + BN + ReLU block."""
    num_classes: int = 10
    image_size: int = 16
