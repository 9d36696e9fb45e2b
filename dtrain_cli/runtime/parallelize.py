"""Apply the plan's parallelism to a freshly built model: ``apply_<technique>`` functions.

Order when more techniques land (as in torchtitan): pipeline split -> tensor parallel ->
activation checkpointing -> compile -> data parallel (DDP / ZeRO / FSDP) last.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.runtime.distributed import DistContext


def apply_data_parallel(model: nn.Module, cfg: DtrainConfig, ctx: DistContext) -> nn.Module:
    """DistributedDataParallel over the mesh's dp axis (bucketed all-reduce overlapped with
    backward). With dp=1 DDP is skipped: there is nothing to reduce."""
    if ctx.mesh["dp"].size() == 1:
        return model
    return DDP(
        model,
        process_group=ctx.dp_group,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=cfg.parallel.ddp_bucket_mb,
        find_unused_parameters=cfg.parallel.find_unused_parameters,
        gradient_as_bucket_view=True,
    )


def apply_compile(model: nn.Module, cfg: DtrainConfig) -> nn.Module:
    """torch.compile each transformer block (off by default: no gain for tiny models on CPU)."""
    if not cfg.train.compile:
        return model
    for name, block in list(model.layers.named_children()):  # type: ignore[union-attr]
        model.layers.register_module(name, torch.compile(block))  # type: ignore[union-attr]
    return model


def parallelize(model: nn.Module, cfg: DtrainConfig, ctx: DistContext) -> nn.Module:
    model = apply_compile(model, cfg)
    return apply_data_parallel(model, cfg, ctx)
