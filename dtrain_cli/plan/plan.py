"""The Plan: everything a run will do, derived from the config, as plain data.

    dtrain plan recipe=gpt_small dp=2

Pure and torch-free. Every launch writes it to ``<run>/plan.yaml``; workers read that
file back instead of composing again, so the parent and every rank agree by construction.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dtrain_cli.mesh.dims import MESH_DIM_NAMES, ParallelDims
from dtrain_cli.sync_modes.base import ServerPlan, SyncPlan

__all__ = ["MESH_DIM_NAMES", "ParallelDims", "Plan", "ServerPlan", "SyncPlan"]


@dataclass(kw_only=True)
class MeshPlan:
    dim_names: list[str]
    """Outermost first: tp innermost so its ranks are neighbours (same node, fastest
    links), pp outermost (point-to-point, least bandwidth-hungry)."""
    shape: list[int]
    dp_replicate: int = 1
    """HSDP: dp split into dp_replicate groups of dp/dp_replicate shards (1: not split)."""

    @property
    def dims(self) -> ParallelDims:
        sizes = dict(zip(self.dim_names, self.shape, strict=True))
        return ParallelDims(
            pp=sizes["pp"], dp=sizes["dp"], tp=sizes["tp"], dp_replicate=self.dp_replicate
        )

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def label(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in zip(self.dim_names, self.shape, strict=True))

    def coords(self, rank: int) -> dict[str, int]:
        """Row-major rank -> coordinates, the layout ``init_device_mesh`` builds."""
        out: dict[str, int] = {}
        for name, size in zip(reversed(self.dim_names), reversed(self.shape), strict=True):
            out[name] = rank % size
            rank //= size
        return {name: out[name] for name in self.dim_names}


@dataclass(kw_only=True)
class BatchPlan:
    micro_batch_size: int
    grad_accum: int
    dp: int
    global_batch_size: int
    seq_len: int
    """Tokens per sample (1 for models whose samples are not token sequences)."""
    tokens_per_step: int
    unit: str = "tokens"
    """What throughput counts: tokens (language models) or samples."""


@dataclass(kw_only=True)
class LRPlan:
    base_lr: float
    base_batch_size: int
    scaling: str
    peak_lr: float
    warmup_steps: int
    decay: str
    min_lr: float
    steps: int

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step ``step`` (0-based): linear warmup, then decay."""
        if self.warmup_steps and step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return self.peak_lr
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "linear":
            shape = 1.0 - progress
        else:  # cosine
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + (self.peak_lr - self.min_lr) * shape


@dataclass(kw_only=True)
class PrecisionPlan:
    name: str
    autocast_dtype: str | None
    """None (no autocast) | bfloat16 | float16."""
    loss_scaling: bool
    param_dtype: str = "float32"


@dataclass(kw_only=True)
class CheckpointPlan:
    every_steps: int
    every_minutes: float
    keep_last: int
    at_end: bool
    async_save: bool
    steps: list[int] = field(default_factory=list)
    """Steps saved by step count (and at the end); time-based saves come on top."""


@dataclass(kw_only=True)
class StagePlan:
    stage: int
    pp_rank: int
    layers: list[int]
    """[first, last + 1) transformer layers of this stage."""
    embeddings: bool
    head: bool
    params: int
    activation_bytes: int


@dataclass(kw_only=True)
class PipelinePlan:
    schedule: str
    num_stages: int
    virtual_stages: int
    microbatches: int
    """Micro-batches per schedule call."""
    calls_per_step: int
    """Schedule calls per optimizer step (gradient accumulation on top of the pipeline)."""
    bubble: float
    """Theoretical idle fraction (p-1)/(v*m + p-1)."""
    stages: list[StagePlan] = field(default_factory=list)


@dataclass(kw_only=True)
class Estimates:
    num_params: int
    params_per_rank: int
    bytes_params: int
    bytes_grads: int
    bytes_optimizer: int
    bytes_activations: int
    bytes_total: int
    flops_per_token: int
    """6 N + 12 L d T (forward + backward, attention included), for MFU."""
    comm_bytes_per_step: int = 0
    """Bytes each rank sends over the dp group per step (ring), after compression."""
    grad_payload_bytes: int = 0
    """Gradient bytes each rank contributes per step after compression."""
    bytes_recompute: int = 0
    """Activation checkpointing: one block's activations, recomputed in backward (transient)."""
    bytes_gathered: int = 0
    """FSDP/HSDP: one unit's parameters gathered for its compute (transient; in
    ``bytes_total``, not in ``bytes_params``, which is the shard held between steps)."""
    activation_checkpointing: str = "none"
    activations_estimated: bool = True
    """False: the model's activations are unknown (a custom model on data=custom): the
    bytes above leave them out."""


@dataclass(kw_only=True)
class ElasticSize:
    """The layout at one node count of an elastic run (``parallel.nnodes=MIN:MAX``)."""

    nnodes: int
    world_size: int
    mesh_shape: list[int]
    batch: BatchPlan
    pipeline: PipelinePlan | None = None
    threads_per_proc: int = 1


@dataclass(kw_only=True)
class ElasticPlan:
    min_nnodes: int
    max_nnodes: int
    sizes: list[ElasticSize]
    """Admissible counts, fewest first; the last is the plan's own layout."""
    refused: list[dict[str, Any]] = field(default_factory=list)
    """``{nnodes, reason}`` for each count in range the run cannot train on."""


def _pipeline_from(d: dict[str, Any] | None) -> PipelinePlan | None:
    if not d:
        return None
    pipe = dict(d)
    pipe["stages"] = [StagePlan(**s) for s in pipe.get("stages", [])]
    return PipelinePlan(**pipe)


@dataclass(kw_only=True)
class ScriptPlan:
    """What every rank runs for ``dtrain run train.py`` (:mod:`dtrain_cli.plan.script`)."""

    path: str | None
    """The script as given (``sys.argv[0]``), or None for a module."""
    module: str | None
    args: list[str]
    file: str
    """The absolute file run as ``__main__`` (a module's too)."""
    workdir: str
    """The directory the command ran in: relative paths and ``-m`` resolve from it."""
    python: str | None = None
    """``launcher.python``: the interpreter every rank runs the script with (None: dtrain's)."""

    def argv(self) -> list[str]:
        """The command as ``python`` would be given it (what torchrun starts)."""
        target = ["-m", self.module] if self.module else [str(self.path)]
        return [*target, *self.args]


@dataclass(kw_only=True)
class Plan:
    recipe: str
    model: str
    world_size: int
    nnodes: int
    nproc_per_node: int
    device: str
    backend: str
    threads_per_proc: int
    start_method: str
    max_restarts: int
    mesh: MeshPlan
    batch: BatchPlan
    lr: LRPlan
    precision: PrecisionPlan
    checkpoint: CheckpointPlan
    estimates: Estimates
    steps: int
    strategy: str
    pipeline: PipelinePlan | None = None
    warnings: list[str] = field(default_factory=list)
    loss: str = "cross_entropy"
    """train.loss resolved (auto -> the model kind's default)."""
    script: ScriptPlan | None = None
    """Your own training script instead of dtrain's trainer (``dtrain run train.py``)."""
    sync: SyncPlan | None = None
    """param_server / diloco only: roles and bytes per role."""
    elastic: ElasticPlan | None = None
    """``parallel.nnodes=MIN:MAX``: the layout at every admissible node count."""

    @property
    def dims(self) -> ParallelDims:
        """Which parallelisms this layout turns on (dp_enabled, tp_enabled, ...)."""
        return self.mesh.dims

    def for_world_size(self, world_size: int) -> Plan:
        """This plan at the size the elastic agent started (the full plan when it is
        that size); ValueError naming the admissible sizes otherwise."""
        if world_size == self.world_size:
            return self
        size = next(
            (s for s in (self.elastic.sizes if self.elastic else []) if s.world_size == world_size),
            None,
        )
        if size is None:
            sizes = (
                [s.world_size for s in self.elastic.sizes] if self.elastic else [self.world_size]
            )
            why = next(
                (
                    r["reason"]
                    for r in (self.elastic.refused if self.elastic else [])
                    if r["nnodes"] * self.nproc_per_node == world_size
                ),
                "not in the plan",
            )
            raise ValueError(
                f"the launcher started {world_size} workers; this plan trains on "
                f"{', '.join(map(str, sizes))} ({why})"
            )
        return replace(
            self,
            world_size=size.world_size,
            nnodes=size.nnodes,
            mesh=MeshPlan(dim_names=list(self.mesh.dim_names), shape=list(size.mesh_shape)),
            batch=size.batch,
            pipeline=size.pipeline,
            threads_per_proc=size.threads_per_proc,
        )

    def rank_table(self) -> list[dict[str, Any]]:
        if self.sync is None or not self.sync.servers:
            return [{"rank": r, **self.mesh.coords(r)} for r in range(self.world_size)]
        rows: list[dict[str, Any]] = [
            {"rank": r, "role": "worker", **self.mesh.coords(r)} for r in self.sync.workers
        ]
        rows += [{"rank": s.rank, "role": "server", "shard": s.shard} for s in self.sync.servers]
        return rows

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = self.rank_table()
        return d

    def to_yaml(self) -> str:
        import yaml  # here, not at import: ``dtrain plan``'s table needs none

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        d = dict(d)
        d.pop("ranks", None)
        parts = {
            "mesh": MeshPlan,
            "batch": BatchPlan,
            "lr": LRPlan,
            "precision": PrecisionPlan,
            "checkpoint": CheckpointPlan,
            "estimates": Estimates,
        }
        for key, kind in parts.items():
            d[key] = kind(**d[key])
        d["pipeline"] = _pipeline_from(d.get("pipeline"))
        if d.get("script"):
            d["script"] = ScriptPlan(**d["script"])
        if d.get("sync"):
            d["sync"] = SyncPlan.from_dict(d["sync"])
        if d.get("elastic"):
            el = dict(d["elastic"])
            el["sizes"] = [
                ElasticSize(
                    **{
                        **s,
                        "batch": BatchPlan(**s["batch"]),
                        "pipeline": _pipeline_from(s.get("pipeline")),
                    }
                )
                for s in el["sizes"]
            ]
            d["elastic"] = ElasticPlan(**el)
        return cls(**d)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        import yaml

        return cls.from_dict(yaml.safe_load(Path(path).read_text()))
