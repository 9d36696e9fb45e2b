"""The strategy seam: what the plan, the advisor and the runtime ask of a strategy.

    dtrain plan recipe=gpt_small dp=4 parallel.strategy=fsdp

A strategy decides how the dp axis holds the model's state (replicated, or sharded: the
optimizer state, the gradients, the parameters) and how gradients move between replicas.
Its facts are pure arithmetic on the config (no torch); its runtime half is a class named
by ``runtime`` (``"module:Class"``) that the worker imports (:func:`runtime_part`).
Adding a strategy is one new file in this package (found by :func:`discover`).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from dtrain_cli.mesh.dims import ParallelDims
from dtrain_cli.registry import Registry

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig


class UnknownStrategy(ValueError):
    pass


REGISTRY: Registry[Strategy] = Registry(
    package="dtrain_cli.strategies",
    key="parallel.strategy",
    order=lambda cls: cls.simplicity,  # simplest first: the advisor's tie-break order
    unknown=UnknownStrategy,
)
register = REGISTRY.register
discover = REGISTRY.discover
names = REGISTRY.names
strategy_for = REGISTRY.get


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """What one rank sends over its dp group per step, as the step-time model needs it."""

    bytes: float
    calls: int
    hidden_behind: str
    """What the traffic can hide behind: ``backward`` (bucketed all-reduce) or ``step``
    (prefetched gathers overlap the whole step)."""


class Strategy:
    """One strategy. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    summary: ClassVar[str]
    runtime: ClassVar[str]
    """``module:Class`` of the runtime half (:class:`dtrain_cli.runtime.parallel.
    data_parallel.DataParallelRuntime`), imported on a worker only."""
    shards_params: ClassVar[bool] = False
    shards_grads: ClassVar[bool] = False
    shards_optimizer: ClassVar[bool] = False
    simplicity: ClassVar[int] = 0
    """The advisor's tie-break between layouts of equal speed: lower is simpler."""
    comm_hooks: ClassVar[bool] = False
    """DDP communication hooks apply (comm.compression, local SGD's averaging)."""
    worker_modules: ClassVar[tuple[str, ...]] = ()
    """What a worker imports before step 1 with dp > 1 (the fork server's preload)."""

    @property
    def plain_replicas(self) -> bool:
        """Nothing sharded: every dp rank holds the whole model and its optimizer state."""
        return not (self.shards_params or self.shards_grads or self.shards_optimizer)

    @property
    def holds_replicas(self) -> bool:
        """Every dp rank holds the whole (tp/pp-local) model: replica checks apply."""
        return not self.shards_params

    # -- config ---------------------------------------------------------------------------
    def problems(self, cfg: DtrainConfig, split_backward: str | None) -> list[str]:
        """Combinations this strategy cannot run (``split_backward``: a zero-bubble
        pipeline schedule, whose weight gradients DDP's hooks never see)."""
        par, out = cfg.parallel, []
        if not self.shards_params and (par.cpu_offload or not par.reshard_after_forward):
            key = (
                "parallel.cpu_offload=true"
                if par.cpu_offload
                else "parallel.reshard_after_forward=false"
            )
            out.append(
                f"{key}: an fsdp option, but parallel.strategy={self.name}; "
                f"set parallel.strategy=fsdp or drop it"
            )
        comp = cfg.comm.compression
        if comp != "none" and (not self.comm_hooks or par.tp > 1 or split_backward):
            out.append(
                f"comm.compression={comp}: DDP communication hooks apply to strategy ddp/zero1 "
                f"without tp or a zero-bubble schedule; this run uses strategy={self.name}, "
                f"tp={par.tp}" + (f", pipeline.schedule={split_backward}" if split_backward else "")
            )
        if par.dp_shard is not None and not self.takes_dp_shard:
            out.append(
                f"parallel.dp_shard={par.dp_shard}: only parallel.strategy=hsdp splits dp into "
                f"shard groups; drop it with strategy={self.name}"
            )
        return out

    takes_dp_shard: ClassVar[bool] = False

    def warnings(self, cfg: DtrainConfig, split_backward: str | None) -> list[str]:
        return []

    def dp_replicate(self, cfg: DtrainConfig, nproc_per_node: int) -> int:
        """Groups dp splits into (HSDP); 1: one group."""
        return 1

    # -- memory and communication (bytes per rank) -------------------------------------------
    def memory_bytes(
        self,
        *,
        params: int,
        grads: int,
        optimizer: int,
        padding: float,
        optimizer_share: float,
        dims: ParallelDims,
    ) -> tuple[int, int, int]:
        """(parameters, gradients, optimizer state) this rank holds between steps, from
        their unsharded sizes; ``padding``: FSDP2's padded size over the unpadded
        (:func:`dtrain_cli.plan.memory.fsdp_padding`), for a strategy that shards
        parameters; ``optimizer_share``: :meth:`optimizer_share`. A gathered FSDP unit is
        transient: ``Estimates.bytes_gathered``."""
        shard = dims.dp_shard
        pad = padding if self.shards_params else 1.0
        if self.shards_optimizer:
            optimizer = math.ceil(optimizer * pad * optimizer_share)
        if self.shards_grads:
            grads = math.ceil(grads * pad / shard)
        if self.shards_params:
            params = math.ceil(params * pad / shard)
        return params, grads, optimizer

    def comm_bytes_per_step(
        self,
        *,
        param_bytes: float,
        payload_bytes: float,
        dims: ParallelDims,
        gathers: int,
        gather_scale: float = 1.0,
    ) -> int:
        """Bytes sent per rank per step over the dp group (ring algorithms): the gradient
        all-reduce of ``payload_bytes`` (after compression). ``gather_scale``: a gathered
        parameter's bytes over its fp32 bytes (0.5 when FSDP gathers in bf16 or fp16)."""
        ring = (dims.dp - 1) / dims.dp
        return int(2 * ring * payload_bytes)

    def dp_traffic(
        self, *, param_bytes: float, low_bytes: int, gathers: int, rounds: int, units: int,
        comm_bytes: int, buckets: int, dims: ParallelDims,
    ) -> Traffic:  # fmt: skip
        """The step-time model's view: the plan's bytes in ``buckets`` all-reduces hidden
        behind backward (``param_bytes``: fp32 parameters this rank holds unsharded)."""
        return Traffic(bytes=comm_bytes, calls=buckets, hidden_behind="backward")

    def temporary_bytes(self, *, block_params: int, tp: int, dims: ParallelDims) -> int:
        """Transient memory at the peak beyond the held state (FSDP's prefetched block
        and its gradient before the reduce-scatter)."""
        return 0

    shards_whole_tensors: ClassVar[bool] = False
    """Its optimizer shards are whole tensors: :meth:`optimizer_share` reads them."""

    def optimizer_share(self, tensors: list[tuple[int, int]], dims: ParallelDims) -> float:
        """The share of this rank's optimizer state, and of the parameters its optimizer
        step updates, on the dp rank holding the most; ``tensors``: (numel, dims) of every
        parameter of this rank's stage when :attr:`shards_whole_tensors` (empty: unknown).
        Even shards by default."""
        return 1 / dims.dp_shard if self.shards_optimizer else 1.0


def runtime_part(strategy: Strategy) -> Any:
    """The runtime half, imported now (on a worker)."""
    module, _, attr = strategy.runtime.partition(":")
    return getattr(importlib.import_module(module), attr)()
