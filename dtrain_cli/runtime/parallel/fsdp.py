"""The runtime half of ``fsdp`` and ``hsdp``: FSDP2 ``fully_shard``.

    dtrain launch recipe=gpt_small dp=4 parallel.strategy=fsdp
    dtrain launch recipe=gpt_small dp=4 parallel.strategy=hsdp parallel.dp_shard=2

``fully_shard`` per block the model's spec names and on the root; parameters, gradients
and optimizer state sharded (ZeRO-3; ``reshard_after_forward=false`` keeps gathered
parameters between forward and backward: ZeRO-2); mixed precision from ``precision``
(bf16 parameters and compute, fp32 gradient reduction). On a 1-D dp mesh that is FSDP; on
the 2-D (dp_replicate, dp_shard) mesh of hsdp, FSDP2 shards over dp_shard and all-reduces
the gradient shards over dp_replicate: hybrid sharding, by the same call.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models import ModelSpec
from dtrain_cli.plan.layout import fsdp_reshards_after_forward
from dtrain_cli.runtime.parallel.data_parallel import DataParallelRuntime
from dtrain_cli.runtime.parallel.mesh import DistContext


class FSDPRuntime(DataParallelRuntime):
    def apply(
        self,
        model: nn.Module,
        spec: ModelSpec,
        cfg: DtrainConfig,
        ctx: DistContext,
        schedule: str | None,
    ) -> nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        par = cfg.parallel
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        low = dtypes.get(cfg.precision.name)
        kwargs: dict[str, Any] = {
            "mesh": ctx.shard_mesh(),  # dp, or (dp_replicate, dp_shard) for hsdp
            "reshard_after_forward": fsdp_reshards_after_forward(cfg, schedule),
            "mp_policy": MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32),
        }
        if par.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
        # torch 2.13 warns when a wrapped module returns a view (tensor parallel's logits:
        # DTensor.to_local() is one): an in-place op on it would skip FSDP's pre-backward
        # hook. dtrain's loss reads the logits out of place; the warning only alarms users.
        warnings.filterwarnings(
            "ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor"
        )
        for unit in spec.fsdp_units(model):  # the model's blocks; the rest goes with the root
            fully_shard(unit, **kwargs)
        return fully_shard(model, **kwargs)
