"""``parallel.strategy=zero1``: DDP with the optimizer state sharded over dp (ZeRO stage 1).

    dtrain launch recipe=gpt_small dp=4 parallel.strategy=zero1

torch's ``ZeroRedundancyOptimizer`` around the optimizer: each dp rank updates its shard
of the parameters and broadcasts it. Runtime half:
:class:`dtrain_cli.runtime.parallel.ddp.ZeRO1Runtime`.
"""

from __future__ import annotations

import functools
import heapq
from typing import TYPE_CHECKING, ClassVar

from dtrain_cli.strategies.base import Traffic, register
from dtrain_cli.strategies.ddp import DDP

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.mesh.dims import ParallelDims


@register
class ZeRO1(DDP):
    name: ClassVar[str] = "zero1"
    summary: ClassVar[str] = "optimizer state sharded over dp (ZeroRedundancyOptimizer)"
    runtime: ClassVar[str] = "dtrain_cli.runtime.parallel.ddp:ZeRO1Runtime"
    shards_optimizer: ClassVar[bool] = True
    simplicity: ClassVar[int] = 1
    worker_modules: ClassVar[tuple[str, ...]] = ("torch.distributed.optim",)

    def problems(self, cfg: DtrainConfig, split_backward: str | None) -> list[str]:
        out = super().problems(cfg, split_backward)
        par = cfg.parallel
        if par.tp > 1:
            out.append(
                "parallel.strategy=zero1: ZeroRedundancyOptimizer does not take "
                "tensor-parallel (DTensor) parameters; use parallel.strategy=fsdp with tp"
            )
        elif split_backward and par.dp > 1:
            from dtrain_cli.mesh.schedules import SCHEDULES, SPLIT_BACKWARD

            out.append(
                f"parallel.strategy=zero1: pipeline.schedule={split_backward} computes weight "
                f"gradients outside DDP's hooks; use parallel.strategy=fsdp or one of the "
                "schedules " + ", ".join(s for s in SCHEDULES if s not in SPLIT_BACKWARD)
            )
        return out

    shards_whole_tensors: ClassVar[bool] = True

    def optimizer_share(self, tensors: list[tuple[int, int]], dims: ParallelDims) -> float:
        """ZeroRedundancyOptimizer shards whole tensors, not elements: per parameter group
        (dtrain's two: matrices, then the rest), largest first onto the least loaded rank
        (``_partition_parameters``). With fewer tensors than ranks, or one large embedding,
        the rank that gets it holds far more than an even share."""
        if not tensors or dims.dp <= 1:
            return super().optimizer_share(tensors, dims)
        matrices = tuple(sorted((n for n, d in tensors if d >= 2), reverse=True))
        rest = tuple(sorted((n for n, d in tensors if d < 2), reverse=True))
        return _fullest_share(matrices, rest, dims.dp)

    def comm_bytes_per_step(
        self,
        *,
        param_bytes: float,
        payload_bytes: float,
        dims: ParallelDims,
        gathers: int,
        gather_scale: float = 1.0,
    ) -> int:
        """DDP's all-reduce, then each owner broadcasts its updated (fp32) parameter shard."""
        ddp = super().comm_bytes_per_step(
            param_bytes=param_bytes, payload_bytes=payload_bytes, dims=dims, gathers=gathers
        )
        return int(ddp + (dims.dp - 1) / dims.dp * param_bytes)

    def dp_traffic(self, **kw) -> Traffic:  # type: ignore[no-untyped-def]
        traffic = super().dp_traffic(**kw)
        return Traffic(bytes=traffic.bytes, calls=traffic.calls + 1, hidden_behind="backward")


@functools.lru_cache(maxsize=256)
def _fullest_share(matrices: tuple[int, ...], rest: tuple[int, ...], ranks: int) -> float:
    """The fullest rank's share of the elements after torch's greedy partition (each group
    sorted largest first; ``dtrain advise`` asks once per layout, the answer per model)."""
    loads = [(0, rank) for rank in range(ranks)]  # a heap: least loaded, lowest rank first
    for numel in (*matrices, *rest):
        load, rank = heapq.heappop(loads)
        heapq.heappush(loads, (load + numel, rank))
    return max(load for load, _ in loads) / max(sum(matrices) + sum(rest), 1)
