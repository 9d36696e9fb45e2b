"""The sync-mode seam: what the plan and the runtime ask of a way to synchronize replicas.

    dtrain plan recipe=gpt_small dp=4 sync.mode=diloco sync.every=16

``sync`` all-reduces gradients every step (the strategy's own communication); the others
let replicas step alone and meet less often (local SGD, DiLoCo) or move the model to
server processes (parameter server). Facts are arithmetic on the config (no torch); the
runtime half is named by ``runtime`` and imported by the worker. Adding a mode is one new
file in this package (found by :func:`discover`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from dtrain_cli.registry import Registry

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.models.spec import ModelFacts


class UnknownSyncMode(ValueError):
    pass


REGISTRY: Registry[SyncMode] = Registry(
    package="dtrain_cli.sync_modes",
    key="sync.mode",
    order=lambda cls: cls.order,  # the default (synchronous) first
    unknown=UnknownSyncMode,
)
register = REGISTRY.register
discover = REGISTRY.discover
names = REGISTRY.names
mode_for = REGISTRY.get


@dataclass(kw_only=True)
class ServerPlan:
    rank: int
    shard: int
    params: int
    """Parameters of this server's shard: the plan's even share (the runtime balances whole
    tensors greedily by size)."""
    optimizer_bytes: int = 0
    """The optimizer state the server keeps for its shard (fp32, the optimizer's words per
    parameter: AdamW's two moments, SGD's momentum)."""


@dataclass(kw_only=True)
class SyncPlan:
    """How replicas synchronize when it is not one all-reduce per step (the plan's part)."""

    mode: str
    workers: list[int]
    servers: list[ServerPlan] = field(default_factory=list)
    max_staleness: int = 0
    every: int = 1
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    bytes_per_step: dict[str, dict[str, int]] = field(default_factory=dict)
    """role -> {"sent": B, "received": B} per rank per optimizer step (amortized)."""
    ddp_bytes_per_step: int = 0
    """What synchronous DDP sends per rank per step on the same model, for comparison."""
    worker_state_bytes: int = 0
    """Bytes of the mode's own optimizer state on each worker (DiLoCo's anchor and outer
    momentum), part of the plan's optimizer state (:meth:`SyncMode.optimizer_bytes`)."""

    def server_of(self, rank: int) -> ServerPlan | None:
        """The parameter server at ``rank``, or None (a worker, or no servers)."""
        return next((s for s in self.servers if s.rank == rank), None)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SyncPlan:
        d = dict(d)
        d["servers"] = [ServerPlan(**s) for s in d.get("servers", [])]
        return cls(**d)


class SyncMode:
    """One mode. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    summary: ClassVar[str]
    runtime: ClassVar[str]
    """``module:Class`` of the runtime half (a ``SyncRuntime``), imported on a worker."""
    order: ClassVar[int] = 1
    reads: ClassVar[tuple[str, ...]] = ()
    """The ``sync.*`` keys this mode reads besides ``mode`` (a key set for another mode is
    named in the plan's warnings: :mod:`dtrain_cli.plan.unread`)."""
    wraps_data_parallel: ClassVar[bool] = True
    """The strategy's data-parallel wrapper runs (False: the mode moves gradients or
    parameters itself)."""
    ddp_comm_hook: ClassVar[str | None] = None
    """``module:function`` ``(cfg, group) -> (hook, state)`` for DDP, or None."""

    def replicas_identical(self, cfg: DtrainConfig) -> bool:
        """dp replicas hold the same parameters after every step (replica checks apply)."""
        return True

    def resume_problems(self, old: DtrainConfig, new: DtrainConfig) -> list[str]:
        """What a resume from a checkpoint of ``old`` cannot do as ``new`` (one line each)."""
        return []

    def extra_processes(self, cfg: DtrainConfig) -> int:
        """Processes the launcher starts in addition to dp*tp*pp (parameter servers)."""
        return 0

    def problems(self, cfg: DtrainConfig, device: str) -> list[str]:
        return []

    def warnings(self, cfg: DtrainConfig) -> list[str]:
        return []

    def model_problems(self, cfg: DtrainConfig, facts: ModelFacts) -> list[str]:
        """What the model's shape rules out (whole tensors per server...)."""
        return []

    def comm_bytes_per_step(self, cfg: DtrainConfig, facts: ModelFacts, strategy_bytes: int) -> int:
        """Bytes a worker sends per step over dp; ``strategy_bytes``: the strategy's
        every-step synchronization."""
        return strategy_bytes

    def optimizer_bytes(self, cfg: DtrainConfig, params_per_rank: int, strategy_bytes: int) -> int:
        """Optimizer-state bytes a worker holds: ``strategy_bytes``, what the strategy keeps
        of the optimizer's state, and any state of the mode's own (checked against
        ``dtrain simulate``, which measures both)."""
        return strategy_bytes

    def sync_plan(self, cfg: DtrainConfig, facts: ModelFacts, ddp_bytes: int) -> SyncPlan | None:
        """The plan's part for a mode that is not one all-reduce per step."""
        return None

    def plan_rows(self, s: SyncPlan) -> list[tuple[str, object]]:
        """``dtrain plan`` rows of the mode's own settings (roles, cadence)."""
        return []

    def sync_at(self, cfg: DtrainConfig, step: int) -> None:
        """Make the 0-based ``step`` a sync step, for ``dtrain simulate``, which counts the
        collectives of its last step (one sync's bytes do not depend on the period). A mode
        that syncs every step has nothing to set."""


def amortized_allreduce(cfg: DtrainConfig, facts: ModelFacts) -> int:
    """One ring all-reduce of the fp32 parameters every ``sync.every`` steps, per step."""
    dp = cfg.parallel.dp
    if dp <= 1:
        return 0
    return int(2 * (dp - 1) / dp * 4 * facts.num_params / cfg.sync.every)


def periodic_sync_plan(
    mode: str, cfg: DtrainConfig, facts: ModelFacts, ddp_bytes: int, **extra: Any
) -> SyncPlan:
    """The plan of a mode whose replicas step alone and all-reduce every ``sync.every``
    steps (local SGD, DiLoCo): every dp rank a worker, the amortized ring bytes per step
    against DDP's; ``extra`` are the mode's own fields (DiLoCo's outer step)."""
    ring = amortized_allreduce(cfg, facts)
    return SyncPlan(
        mode=mode,
        workers=list(range(cfg.parallel.dp)),
        every=cfg.sync.every,
        bytes_per_step={"worker": {"sent": ring, "received": ring}},
        ddp_bytes_per_step=ddp_bytes,
        **extra,
    )


def per_replica_state_problems(mode: str, old: DtrainConfig, new: DtrainConfig) -> list[str]:
    """Replicas that step alone checkpoint an inner optimizer state each (DiLoCo also its
    parameters): a resume needs the same mode and the same replicas."""
    if old.sync.mode != new.sync.mode:
        return [
            f"sync.mode={new.sync.mode}: the checkpoint (sync.mode={old.sync.mode}) and this "
            f"run differ in whether each replica keeps its own optimizer state; resume with "
            f"sync.mode={old.sync.mode}"
        ]
    if old.parallel.dp == new.parallel.dp:
        return []
    return [
        f"parallel.dp={new.parallel.dp}: sync.mode={mode} checkpoints each replica's own "
        f"optimizer state (the checkpoint has dp={old.parallel.dp}); resume at "
        f"dp={old.parallel.dp}"
    ]


def elastic_problems(mode: str, cfg: DtrainConfig) -> list[str]:
    """The same reason against ``nnodes=MIN:MAX``: a shrunk group has fewer replicas."""
    par = cfg.parallel
    if par.min_nnodes is None or par.min_nnodes >= par.nnodes:
        return []
    return [
        f"parallel.nnodes={par.min_nnodes}:{par.nnodes}: sync.mode={mode} checkpoints each "
        f"replica's own optimizer state, so it resumes at the same dp only; use a fixed node "
        f"count"
    ]


def needs_plain_replicas(cfg: DtrainConfig) -> bool:
    """The strategy replicates everything (nothing sharded) and the layout is one rank
    per replica (no tp, no pp): what the modes that step replicas alone need."""
    from dtrain_cli.strategies import strategy_for

    par = cfg.parallel
    return strategy_for(par.strategy).plain_replicas and par.tp == 1 and par.pp == 1


def runtime_part(mode: SyncMode) -> Any:
    module, _, attr = mode.runtime.partition(":")
    return getattr(importlib.import_module(module), attr)
