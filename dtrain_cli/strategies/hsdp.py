"""``parallel.strategy=hsdp``: FSDP inside a shard group, replicas across the groups.

    dtrain launch recipe=gpt_small dp=4 parallel.strategy=hsdp parallel.dp_shard=2
    dtrain plan recipe=gpt_1b parallel.strategy=hsdp parallel.nnodes=64 dp=512

Hybrid sharding: dp splits into ``dp / dp_shard`` groups of ``dp_shard`` ranks (by default
the dp ranks of one node); each group holds one copy of the model, sharded FSDP-style over
its ranks (the gathers stay on the node's fast links), and the gradient shards are
all-reduced across the groups. FSDP2 ``fully_shard`` on the 2-D mesh
(``dp_replicate`` x ``dp_shard``) does exactly this; the runtime half is FSDP's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dtrain_cli.strategies.base import register
from dtrain_cli.strategies.fsdp import FSDP

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig


@register
class HSDP(FSDP):
    name: ClassVar[str] = "hsdp"
    summary: ClassVar[str] = "FSDP within a shard group (a node), replicated across groups"
    simplicity: ClassVar[int] = 3
    takes_dp_shard: ClassVar[bool] = True

    def shard_size(self, cfg: DtrainConfig, nproc_per_node: int) -> int:
        """``parallel.dp_shard``, or the dp ranks of one node (the mesh is (pp, dp, tp),
        tp innermost: a node holds nproc_per_node / tp consecutive dp ranks)."""
        par = cfg.parallel
        if par.dp_shard is not None:
            return par.dp_shard
        return max(1, min(par.dp, nproc_per_node // max(par.tp, 1)))

    def dp_replicate(self, cfg: DtrainConfig, nproc_per_node: int) -> int:
        shard = self.shard_size(cfg, nproc_per_node)
        return cfg.parallel.dp // shard if shard and cfg.parallel.dp % shard == 0 else 1

    def problems(self, cfg: DtrainConfig, split_backward: str | None) -> list[str]:
        out = super().problems(cfg, split_backward)
        par = cfg.parallel
        if par.dp_shard is not None and (par.dp_shard < 1 or par.dp % par.dp_shard):
            out.append(
                f"parallel.dp_shard={par.dp_shard}: must divide dp={par.dp} (the shard groups "
                f"split dp evenly); use one of "
                + ", ".join(str(d) for d in range(1, par.dp + 1) if par.dp % d == 0)
            )
        if par.min_nnodes is not None and par.min_nnodes < par.nnodes:
            out.append(
                f"parallel.nnodes={par.min_nnodes}:{par.nnodes}: hsdp's shard groups are fixed "
                "to the planned layout; use a fixed node count, or parallel.strategy=fsdp"
            )
        return out

    def warnings(self, cfg: DtrainConfig, split_backward: str | None) -> list[str]:
        out = super().warnings(cfg, split_backward)
        par = cfg.parallel
        nproc = par.nproc_per_node or max(1, par.dp * par.tp * par.pp // max(par.nnodes, 1))
        if par.dp > 1 and self.dp_replicate(cfg, nproc) == 1:
            out.append(
                f"parallel.strategy=hsdp: one shard group of all dp={par.dp} ranks, no replicas "
                "(the same as fsdp); parallel.dp_shard=N shards over N ranks, replicas across"
            )
        return out
