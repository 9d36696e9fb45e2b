"""The built-in conv + BatchNorm classifier (``recipe=cnn_bn``): config, counts, checks.

    dtrain launch recipe=cnn_bn dp=2 parallel.sync_batchnorm=true

Torch-free (the plan imports it); its config is :mod:`.config`, the module :mod:`.net`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtrain_cli.models.cnn.config import KERNEL, CNNConfig
from dtrain_cli.models.spec import ModelFacts, ModelSpec

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig


class CNNSpec(ModelSpec):
    kind = "cnn_bn"
    config_class = CNNConfig
    cfg: CNNConfig

    def facts(self) -> ModelFacts:
        m = self.cfg
        total, c_in, mats, sizes = 0, 3, [], []
        for i, c in enumerate(m.channels):
            total += c_in * c * KERNEL * KERNEL + c + 2 * c  # conv (+bias) + BN affine
            mats.append((c, c_in * KERNEL * KERNEL))
            sizes += [(c_in * c * KERNEL * KERNEL, 4, i)] + [(c, 1, i)] * 3
            c_in = c
        total += c_in * m.num_classes + m.num_classes
        mats.append((m.num_classes, c_in))
        sizes += [(m.num_classes * c_in, 2, "last"), (m.num_classes, 1, "last")]
        pixels = m.image_size * m.image_size
        return ModelFacts(
            num_params=total,
            unit="samples",
            tokens_per_sample=1,
            flops_per_unit=6 * total * pixels,  # rough: every conv weight touches every pixel
            matrix_shapes=mats,
            batchnorm_layers=len(m.channels),
            tensor_sizes=sizes,
        )

    def activation_bytes(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """What backward keeps per sample: the image (the first conv's input), each block's
        BatchNorm input and ReLU output (the next conv's input) at that block's resolution
        (stride 2 after the first: ceil(side / 2) each time), the pooled features."""
        side = self.cfg.image_size
        values = 3 * side * side
        for i, c in enumerate(self.cfg.channels):
            side = side if i == 0 else (side + 1) // 2
            values += 2 * c * side * side
        values += self.cfg.channels[-1]
        return 0.0, float(micro_batch * values * bytes_per_value)

    def value_problems(self) -> list[str]:
        m = self.cfg
        out = []
        if not m.channels or min(m.channels) < 1 or max(m.channels) > 2**16:
            out.append(f"model.channels={m.channels}: needs one or more entries >= 1, e.g. [16,32]")
        if m.num_classes < 2:
            out.append(f"model.num_classes={m.num_classes}: must be >= 2")
        if m.image_size < 8:
            out.append(f"model.image_size={m.image_size}: must be >= 8")
        return out

    def problems(self, cfg: DtrainConfig) -> list[str]:
        par = cfg.parallel
        out = []
        if par.tp > 1 or par.pp > 1:
            out.append(f"model.kind=cnn_bn: data parallel only (got tp={par.tp}, pp={par.pp})")
        if cfg.data.source not in ("shapes", "custom"):
            out.append(
                f"data.source={cfg.data.source}: model.kind=cnn_bn trains on images; "
                f"use data=shapes or your own images (data=custom)"
            )
        return out

    @property
    def block_size(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int | None:
        return None

    def build(self, device: Any) -> Any:
        import torch

        from dtrain_cli.models.cnn.net import ConvBNNet

        with torch.device(device):
            return ConvBNNet(self.cfg)

    def fsdp_units(self, model: Any) -> list[Any]:
        return []
