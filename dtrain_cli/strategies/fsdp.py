"""``parallel.strategy=fsdp``: parameters, gradients and optimizer state sharded over dp.

    dtrain launch recipe=gpt_small dp=4 parallel.strategy=fsdp
    dtrain launch recipe=gpt_small dp=4 parallel.strategy=fsdp parallel.reshard_after_forward=false

FSDP2 ``fully_shard`` per block and on the root (ZeRO-3; ``reshard_after_forward=false``
keeps gathered parameters from forward to backward: ZeRO-2). Runtime half:
:class:`dtrain_cli.runtime.parallel.fsdp.FSDPRuntime`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dtrain_cli.strategies.base import Strategy, Traffic, register

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.mesh.dims import ParallelDims


@register
class FSDP(Strategy):
    name: ClassVar[str] = "fsdp"
    summary: ClassVar[str] = "params, grads and optimizer state sharded over dp (FSDP2)"
    runtime: ClassVar[str] = "dtrain_cli.runtime.parallel.fsdp:FSDPRuntime"
    shards_params: ClassVar[bool] = True
    shards_grads: ClassVar[bool] = True
    shards_optimizer: ClassVar[bool] = True
    simplicity: ClassVar[int] = 2
    worker_modules: ClassVar[tuple[str, ...]] = ("torch.distributed.fsdp",)

    def warnings(self, cfg: DtrainConfig, split_backward: str | None) -> list[str]:
        if split_backward and cfg.parallel.reshard_after_forward:
            return [
                f"parallel.reshard_after_forward=true: not under pipeline.schedule="
                f"{split_backward}, whose weight pass needs each stage's gathered parameters: "
                "they stay gathered from forward to backward (ZeRO-2)"
            ]
        return []

    def comm_bytes_per_step(
        self,
        *,
        param_bytes: float,
        payload_bytes: float,
        dims: ParallelDims,
        gathers: int,
        gather_scale: float = 1.0,
    ) -> int:
        """All-gathers of the parameters in the compute dtype (forward, and backward when
        resharded) and one fp32 reduce-scatter of the gradients within a shard group (FSDP2's
        ``MixedPrecisionPolicy(param_dtype=low, reduce_dtype=fp32)``); HSDP then all-reduces
        each gradient shard across the groups."""
        shard, groups = dims.dp_shard, dims.dp_replicate
        within = (shard - 1) / shard * param_bytes * (gathers * gather_scale + 1)
        across = 2 * (groups - 1) / groups * param_bytes / shard
        return int(within + across)

    def dp_traffic(
        self, *, param_bytes: float, low_bytes: int, gathers: int, rounds: int, units: int,
        comm_bytes: int, buckets: int, dims: ParallelDims,
    ) -> Traffic:  # fmt: skip
        """FSDP2 as it runs: the gathers in the compute dtype (``low_bytes`` per value) for
        every micro-batch outside a pipeline (``rounds``: accumulation re-gathers), one fp32
        reduce-scatter per unit; prefetched, so they overlap the whole step."""
        shard, groups = dims.dp_shard, dims.dp_replicate
        params = param_bytes / 4
        within = (shard - 1) / shard * params * (low_bytes * gathers * rounds + 4)
        across = 2 * (groups - 1) / groups * 4 * params / shard
        calls = units * (gathers * rounds + 1) + (units if groups > 1 else 0)
        return Traffic(bytes=within + across, calls=calls, hidden_behind="step")

    def temporary_bytes(self, *, block_params: int, tp: int, dims: ParallelDims) -> int:
        """The prefetched next block and a block's gradient before its reduce-scatter."""
        return 2 * 4 * block_params // max(tp, 1) if dims.dp_enabled else 0
