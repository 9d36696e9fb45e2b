"""``sync.mode=local_sgd``: replicas step alone and average their parameters every
``sync.every`` steps (after ``sync.warmup_steps`` synchronous ones).

    dtrain launch recipe=gpt_small dp=4 sync.mode=local_sgd sync.every=8

torch's post-local-SGD DDP hook (all-reduce during warm-up, nothing after) and
``PeriodicModelAverager``. Runtime half: :class:`dtrain_cli.runtime.sync.local_sgd.LocalSGDSync`.
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
class LocalSGD(SyncMode):
    name: ClassVar[str] = "local_sgd"
    summary: ClassVar[str] = "replicas step alone, parameters averaged every sync.every steps"
    runtime: ClassVar[str] = "dtrain_cli.runtime.sync.local_sgd:LocalSGDSync"
    reads: ClassVar[tuple[str, ...]] = ("every", "warmup_steps")
    ddp_comm_hook: ClassVar[str | None] = "dtrain_cli.runtime.sync.local_sgd:post_local_sgd_hook"

    def replicas_identical(self, cfg: DtrainConfig) -> bool:
        return False

    def resume_problems(self, old: DtrainConfig, new: DtrainConfig) -> list[str]:
        return per_replica_state_problems(self.name, old, new)

    def problems(self, cfg: DtrainConfig, device: str) -> list[str]:
        par, comp, out = cfg.parallel, cfg.comm.compression, elastic_problems(self.name, cfg)
        if not needs_plain_replicas(cfg):
            out.append(
                f"sync.mode=local_sgd: needs strategy=ddp with tp=1 and pp=1 "
                f"(got strategy={par.strategy}, tp={par.tp}, pp={par.pp})"
            )
        if comp != "none":
            out.append(
                f"comm.compression={comp}: local SGD does not all-reduce "
                f"gradients after warm-up; use comm.compression=none"
            )
        return out

    def warnings(self, cfg: DtrainConfig) -> list[str]:
        out = []
        if cfg.sync.warmup_steps > cfg.train.steps:
            out.append(
                f"sync.warmup_steps={cfg.sync.warmup_steps} is longer than training "
                f"(train.steps={cfg.train.steps}): every step is synchronous"
            )
        if cfg.sync.every == 1:  # torch's PeriodicModelAverager says so too, in its words
            out.append(
                "sync.every=1: averaging the parameters every step sends no less than "
                "sync.mode=sync's gradient all-reduce; use sync.mode=sync, or sync.every > 1"
            )
        return out

    def comm_bytes_per_step(self, cfg: DtrainConfig, facts: ModelFacts, strategy_bytes: int) -> int:
        return amortized_allreduce(cfg, facts)

    def plan_rows(self, s: SyncPlan) -> list[tuple[str, object]]:
        return [("parameters averaged every", f"{s.every} steps (after the warm-up's)")]

    def sync_at(self, cfg: DtrainConfig, step: int) -> None:
        """torch's ``PeriodicModelAverager`` averages at the first step past the warm-up,
        then every period: the steps before ``step`` are the (synchronous) warm-up."""
        cfg.sync.warmup_steps = step

    def sync_plan(self, cfg: DtrainConfig, facts: ModelFacts, ddp_bytes: int) -> SyncPlan:
        """Bytes per step after the synchronous warm-up (one average every ``every``)."""
        return periodic_sync_plan(self.name, cfg, facts, ddp_bytes)
