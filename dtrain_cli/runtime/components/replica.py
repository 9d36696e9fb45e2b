"""Replica checks: data-parallel replicas, and the tensor-parallel ranks of one for what tp
does not split, must hold bit-identical parameters.

    dtrain launch recipe=gpt_small dp=4 debug.replica_check_every=50
    dtrain launch recipe=gpt_small dp=4 debug.replica_check_every=50 debug.replica_check_grads=true

``maybe_check(step)`` every ``debug.replica_check_every`` steps, after the optimizer step:
one int64 per parameter (the sum of its bit patterns: any changed bit changes it) and,
when asked, per gradient after the reduce, gathered over the dp group; the first rank and
parameter that differ from dp rank 0 are named and the run stops (:class:`ReplicaError`).
Under hsdp each rank's own shards are compared across the shard groups (the ranks of one
shard coordinate hold the same shard); fsdp's ranks hold no replicas and locally stepping
(local SGD) replicas differ between averagings: neither is compared.
``summary()`` at the end: the sum and sum of squares of the full model's parameters
(layout-invariant; what tests and ``dtrain compare`` read) and, with
``debug.replica_check_at_end``, a sha256 of every parameter gathered over the dp group.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import torch
import torch.distributed as dist

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.diagnostics.watchdog import COLLECTIVES
from dtrain_cli.runtime.parallel.dtensors import full_tensor, is_dtensor, local_tensor
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.runtime.parallel.parallelize import ParallelModel
from dtrain_cli.strategies import strategy_for
from dtrain_cli.sync_modes import mode_for

log = logging.getLogger("dtrain")


class ReplicaError(RuntimeError):
    """Data-parallel replicas hold different parameters (or gradients)."""


BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def param_name(name: str) -> str:
    """A parameter's name in the model, without the wrappers' prefixes (DDP, compile)."""
    return name.replace("_orig_mod.", "").removeprefix("module.")


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """The sum of a tensor's bit patterns as int64 (exact: any changed bit changes it)."""
    t = local_tensor(t).detach().contiguous()
    return t.view(BITS[t.element_size()]).to(torch.int64).sum()


def _on_tp(t: torch.Tensor) -> bool:
    """A DTensor whose mesh has the tp dim (split or placed by tensor parallel)."""
    mesh = t.device_mesh if is_dtensor(t) else None  # type: ignore[attr-defined]
    return mesh is not None and "tp" in (mesh.mesh_dim_names or ())


class ReplicaChecker:
    def __init__(self, cfg: DtrainConfig, plan: Plan, ctx: DistContext, pm: ParallelModel) -> None:
        self.plan, self.ctx, self.pm = plan, ctx, pm
        dbg = cfg.debug
        self.every, self.grads, self.at_end = (
            dbg.replica_check_every,
            dbg.replica_check_grads,
            dbg.replica_check_at_end,
        )
        self.checks = 0
        self.holds_replicas = strategy_for(plan.strategy).holds_replicas
        replicated = self.holds_replicas and mode_for(cfg.sync.mode).replicas_identical(cfg)
        if self.every and plan.batch.dp > 1 and not replicated and plan.dims.dp_replicate < 2:
            log.warning(
                "debug.replica_check_every: not checked (strategy=%s, sync.mode=%s: dp ranks "
                "do not hold replicas at every step)",
                plan.strategy,
                cfg.sync.mode,
            )
        self.dp_active = plan.batch.dp > 1 and replicated
        # hsdp: the ranks of one shard coordinate across the shard groups hold the same shard
        self.shard_replicas = not self.holds_replicas and plan.dims.dp_replicate > 1
        # tp ranks hold the parameters tp does not split (norms, biases after a row-parallel
        # layer) alike: replicated activations drawn apart (dropout) made them drift apart
        self.tp_active = ctx.mesh["tp"].size() > 1
        self.active = bool(self.every) and (self.dp_active or self.shard_replicas or self.tp_active)

    def maybe_check(self, step: int) -> None:
        """After the optimizer step of ``step``, before gradients are zeroed."""
        if not self.active or step % self.every:
            return
        named = [(param_name(n), p) for part in self.pm.parts for n, p in part.named_parameters()]
        if self.grads:
            named += [(f"gradient of {n}", p.grad) for n, p in named if p.grad is not None]
        self.checks += 1
        if self.dp_active:
            self._compare(step, named, self.ctx.dp_group, "data-parallel replicas", "dp")
        if self.shard_replicas:  # each rank's own shards, across the shard groups
            group = self.ctx.mesh["dp_replicate"].get_group()
            self._compare(step, named, group, "hsdp replicas (shard groups)", "dp_replicate")
        if self.tp_active:  # what tp does not split: plain, or sharded over dp alone (fsdp)
            alike = [(n, t) for n, t in named if not _on_tp(t)]
            self._compare(
                step, alike, self.ctx.mesh["tp"].get_group(), "tensor-parallel ranks", "tp"
            )

    def _compare(self, step: int, named: list, group: Any, who: str, axis: str) -> None:
        """One int64 per tensor, gathered over ``group``; the first that differs is named."""
        if not named:
            return
        mine = torch.stack([fingerprint(t) for _, t in named]).to(self.ctx.device)
        outs = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        with COLLECTIVES.enter("all_gather", step, "replica check"):
            dist.all_gather(outs, mine, group=group)
        gathered = torch.stack(outs)
        differ = (gathered != gathered[0]).cpu()
        if not bool(differ.any()):
            return
        local, index = (int(i) for i in differ.nonzero()[0])
        rank, base = dist.get_global_rank(group, local), dist.get_global_rank(group, 0)
        raise ReplicaError(
            f"step {step}: {who} differ: rank {rank} ({axis} rank {local}) holds another "
            f"{named[index][0]} than rank {base} ({axis} rank 0); "
            f"{int(differ.any(dim=0).sum())} of {len(named)} tensors differ"
        )

    def not_applicable(self) -> str | None:
        """Why the end-of-run replica check does not apply to this layout (None: it does)."""
        if not self.holds_replicas and self.plan.dims.dp_enabled and not self.shard_replicas:
            return (
                f"not applicable: {self.plan.strategy} shards the parameters over dp (no "
                "replicas to compare)"
            )
        return None

    def digests(self) -> list[str]:
        """sha256 of this rank's parameter bytes (local shards: the same tp shard / pp stage
        across the dp group), gathered over the dp group. FSDP (dp > 1) has no replicas:
        each dp rank holds another shard, so the digest is of the full parameters and there
        is nothing to compare; under hsdp the full digest comes first, then those of this
        rank's own shards across the shard groups."""
        sharded = self.not_applicable() is not None
        if sharded or self.shard_replicas:
            full = _sha256(full_tensor(p) for p in self.pm.parameters())  # collective
            if not self.shard_replicas:
                return [full]
            group, size = self.ctx.mesh["dp_replicate"].get_group(), self.plan.dims.dp_replicate
        else:
            full, group, size = None, self.ctx.dp_group, self.plan.batch.dp
        out: list[str | None] = [None] * size
        mine = _sha256(local_tensor(p) for p in self.pm.parameters())
        dist.all_gather_object(out, mine, group=group)
        return ([full] if full else []) + [str(d) for d in out]

    def moments(self) -> tuple[float, float]:
        """Sum and sum of squares of the full model's parameters, whatever the layout."""
        sums = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        counts_once = self.ctx.dp_rank == 0 and self.ctx.mesh["tp"].get_local_rank() == 0
        for p in self.pm.parameters():
            full = full_tensor(p)  # collective under TP
            if counts_once:
                full = full.detach().double()
                sums += torch.stack([full.sum(), full.square().sum()])
        dist.all_reduce(sums)
        return float(sums[0]), float(sums[1])

    def summary(self) -> dict[str, Any]:
        """param_sum / param_sq_sum always (one small all-reduce); the full digest only
        with ``debug.replica_check_at_end``."""
        out: dict[str, Any] = {}
        if self.at_end:
            digests, why = self.digests(), self.not_applicable()
            replicas = digests[1:] if self.shard_replicas else digests
            out = {
                "param_digest": digests[0],
                "replicas_identical": None if why else len(set(replicas)) == 1,
                "replicas_check": why,
            }
        param_sum, param_sq_sum = self.moments()
        out = {"param_sum": param_sum, "param_sq_sum": param_sq_sum, **out}
        if self.active:
            out["replica_checks"] = self.checks
        return out


def _sha256(tensors: Any) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
