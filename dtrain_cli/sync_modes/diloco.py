"""``sync.mode=diloco``: ``sync.every`` inner steps per replica with the normal optimizer,
then one outer step: the averaged parameter delta through an outer Nesterov SGD.

    dtrain plan recipe=gpt_small dp=4 sync.mode=diloco sync.every=16

One ring all-reduce of the parameter delta every ``every`` steps, amortized per step
(about ``every`` times less than DDP). Runtime half:
:class:`dtrain_cli.runtime.sync.diloco.DiLoCoSync`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dtrain_cli.sync_modes.base import (
    SyncMode,
    SyncPlan,
    amortized_allreduce,
    elastic_problems,
    needs_plain_replicas,
    per_replica_state_problems,
    periodic_sync_plan,
    register,
)

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.models.spec import ModelFacts


@register
class DiLoCo(SyncMode):
    name: ClassVar[str] = "diloco"
    summary: ClassVar[str] = "inner steps alone, an outer Nesterov step on the averaged delta"
    runtime: ClassVar[str] = "dtrain_cli.runtime.sync.diloco:DiLoCoSync"
    reads: ClassVar[tuple[str, ...]] = ("every", "outer_lr", "outer_momentum")
    wraps_data_parallel: ClassVar[bool] = False

    def replicas_identical(self, cfg: DtrainConfig) -> bool:
        return False

    def resume_problems(self, old: DtrainConfig, new: DtrainConfig) -> list[str]:
        return per_replica_state_problems(self.name, old, new)

    def problems(self, cfg: DtrainConfig, device: str) -> list[str]:
        par, out = cfg.parallel, elastic_problems(self.name, cfg)
        if not needs_plain_replicas(cfg):
            out.append(
                f"sync.mode=diloco: replicas step alone between outer steps; needs "
                f"strategy=ddp with tp=1 and pp=1 (got strategy={par.strategy}, tp={par.tp}, "
                f"pp={par.pp})"
            )
        if cfg.comm.compression != "none":
            out.append(
                f"comm.compression={cfg.comm.compression}: DiLoCo all-reduces the fp32 "
                f"parameter delta; use comm.compression=none"
            )
        return out

    def comm_bytes_per_step(self, cfg: DtrainConfig, facts: ModelFacts, strategy_bytes: int) -> int:
        return amortized_allreduce(cfg, facts)

    def optimizer_bytes(self, cfg: DtrainConfig, params_per_rank: int, strategy_bytes: int) -> int:
        """The inner optimizer's state and the outer step's: an fp32 anchor copy of the
        parameters (what the averaged delta is taken from) and, with outer momentum, its
        Nesterov buffer."""
        return strategy_bytes + outer_state_bytes(cfg, params_per_rank)

    def plan_rows(self, s: SyncPlan) -> list[tuple[str, object]]:
        return [
            ("inner steps / outer lr / momentum", f"{s.every} / {s.outer_lr} / {s.outer_momentum}")
        ]

    def sync_at(self, cfg: DtrainConfig, step: int) -> None:
        """A replica's outer step follows every ``sync.every``-th inner step."""
        cfg.sync.every = step + 1

    def sync_plan(self, cfg: DtrainConfig, facts: ModelFacts, ddp_bytes: int) -> SyncPlan:
        return periodic_sync_plan(
            self.name,
            cfg,
            facts,
            ddp_bytes,
            outer_lr=cfg.sync.outer_lr,
            outer_momentum=cfg.sync.outer_momentum,
            worker_state_bytes=outer_state_bytes(cfg, facts.num_params),
        )


def outer_state_bytes(cfg: DtrainConfig, params: int) -> int:
    """The outer step's fp32 state per worker: the anchor, and the momentum if any."""
    return 4 * (1 + int(cfg.sync.outer_momentum > 0)) * params
