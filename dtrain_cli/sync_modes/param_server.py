"""``sync.mode=param_server``: server ranks hold the parameters and the optimizer; workers
push gradients and pull parameters, at most ``sync.max_staleness`` steps behind.

    dtrain plan recipe=gpt_small dp=4 sync.mode=param_server sync.servers=2

Ranks ``0..dp-1`` are workers (the mesh), ranks ``dp..dp+servers-1`` serve parameter
shards (whole tensors, balanced by size). Per step a worker sends its gradient (4 B per
parameter) and receives the parameters back; a server receives and sends ``dp`` times its
shard. Runtime half: :class:`dtrain_cli.runtime.sync.param_server_client.ParamServerSync`
(workers) and :mod:`dtrain_cli.runtime.sync.param_server` (servers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dtrain_cli.sync_modes.base import (
    ServerPlan,
    SyncMode,
    SyncPlan,
    needs_plain_replicas,
    per_replica_state_problems,
    register,
)

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.models.spec import ModelFacts

HEADER_WORDS = 5
"""fp32 words in front of every message: kind, step, version read, the worker's gradient
norm (push) or the seconds the bound held it (reply), and in a reply the squared norm of the
gradient the server stepped with for that worker (its shard's part)."""
SUPPORTED = "parallel.strategy=ddp, tp=1, pp=1, one node, run.device=cpu"


def assign_shards(sizes: list[int], servers: int) -> list[list[int]]:
    """Parameter indices per server: whole tensors, largest first onto the least loaded
    server; each list in model order."""
    load = [0] * servers
    out: list[list[int]] = [[] for _ in range(servers)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        s = min(range(servers), key=lambda j: (load[j], j))
        out[s].append(i)
        load[s] += sizes[i]
    return [sorted(idx) for idx in out]


def optim_slots(cfg: DtrainConfig) -> tuple[str, ...]:
    """Per-parameter optimizer state the servers keep (and checkpoints hold, flattened)."""
    if cfg.optim.name == "adamw":
        return ("exp_avg", "exp_avg_sq")
    return ("momentum_buffer",) if cfg.optim.momentum > 0 else ()


def shard_sizes(num_params: int, servers: int) -> list[int]:
    """The plan's estimate of each server's share (the runtime balances whole tensors)."""
    base, extra = divmod(num_params, servers)
    return [base + (1 if i < extra else 0) for i in range(servers)]


@register
class ParamServer(SyncMode):
    name: ClassVar[str] = "param_server"
    summary: ClassVar[str] = "servers hold the model; workers push gradients, pull parameters"
    runtime: ClassVar[str] = "dtrain_cli.runtime.sync.param_server_client:ParamServerSync"
    reads: ClassVar[tuple[str, ...]] = ("servers", "max_staleness")
    wraps_data_parallel: ClassVar[bool] = False

    def replicas_identical(self, cfg: DtrainConfig) -> bool:
        return cfg.sync.max_staleness == 0

    def extra_processes(self, cfg: DtrainConfig) -> int:
        return cfg.sync.servers

    def resume_problems(self, old: DtrainConfig, new: DtrainConfig) -> list[str]:
        """The servers checkpoint the optimizer state in shards of their own (one per
        server), and with staleness each worker its own: a resume keeps the mode, the
        servers, and which side of 0 the staleness is on (a switch to sync dropped the
        servers' AdamW moments silently; the rest failed in start-up)."""
        o, n = old.sync, new.sync
        if o.mode != n.mode:
            return [
                f"sync.mode={n.mode}: the checkpoint (sync.mode={o.mode}) keeps its optimizer "
                "state where this run would not look (the parameter servers' shards, or the "
                f"workers); resume with sync.mode={o.mode}"
            ]
        out = []
        if o.servers != n.servers:
            out.append(
                f"sync.servers={n.servers}: the checkpoint's optimizer state is sharded over "
                f"{o.servers} server(s); resume with sync.servers={o.servers}"
            )
        if (o.max_staleness > 0) != (n.max_staleness > 0):
            kept = "each worker its own" if o.max_staleness else "one for all workers"
            out.append(
                f"sync.max_staleness={n.max_staleness}: the checkpoint (max_staleness="
                f"{o.max_staleness}) keeps {kept} worker optimizer state; resume with "
                f"max_staleness {'above 0' if o.max_staleness else '0'}"
            )
        elif o.max_staleness > 0:
            out += per_replica_state_problems(self.name, old, new)
        return out

    def problems(self, cfg: DtrainConfig, device: str) -> list[str]:
        par, sync, out = cfg.parallel, cfg.sync, []
        if not needs_plain_replicas(cfg):
            out.append(
                f"sync.mode=param_server: parameters and optimizer state live on the servers, "
                f"so it does not combine with strategy={par.strategy}, tp={par.tp}, "
                f"pp={par.pp}; supported: {SUPPORTED}"
            )
        if max(par.nnodes, 1) > 1 or device != "cpu":
            out.append(
                f"sync.mode=param_server: gloo point-to-point on CPU tensors, one node "
                f"(got nnodes={par.nnodes}, device={device}); supported: {SUPPORTED}"
            )
        if cfg.comm.compression != "none":
            out.append(
                f"comm.compression={cfg.comm.compression}: the parameter server sends full "
                f"fp32 gradients; use comm.compression=none"
            )
        if cfg.precision.name == "fp16":
            out.append("sync.mode=param_server: no loss scaling on the servers; use fp32/bf16")
        if cfg.checkpoint.async_save:
            out.append(
                "checkpoint.async_save=true: a parameter-server checkpoint is written while "
                "the servers hold still (workers and servers save in one step); use "
                "checkpoint.async_save=false with sync.mode=param_server"
            )
        per_step = [
            f"train.{k}={getattr(cfg.train, k, 'off')}"
            for k in ("on_nan", "on_spike")
            if getattr(cfg.train, k, "off") in ("skip", "rollback")
        ]
        if per_step:
            out.append(
                f"{', '.join(per_step)}: the servers apply every pushed gradient, so an update "
                "cannot be skipped or rolled back on the workers; use stop with param_server"
            )
        want = par.dp * par.tp * par.pp + sync.servers
        if par.nproc_per_node is not None and par.nproc_per_node * max(par.nnodes, 1) != want:
            out.append(
                f"sync.servers={sync.servers}: dp + servers = {par.dp} + {sync.servers} = {want} "
                f"processes but nproc_per_node={par.nproc_per_node}; set "
                f"nproc_per_node={want} or drop it"
            )
        return out

    def model_problems(self, cfg: DtrainConfig, facts: ModelFacts) -> list[str]:
        """Each server needs at least one parameter tensor to hold (whole tensors)."""
        matrices = len(facts.matrix_shapes)
        if not matrices or cfg.sync.servers <= matrices:
            return []
        return [
            f"sync.servers={cfg.sync.servers}: the model has {matrices} weight matrices to "
            f"shard between servers (whole tensors each); use at most {matrices}"
        ]

    def comm_bytes_per_step(self, cfg: DtrainConfig, facts: ModelFacts, strategy_bytes: int) -> int:
        return 4 * facts.num_params  # a worker's gradient push (sync_plan has both roles)

    def optimizer_bytes(self, cfg: DtrainConfig, params_per_rank: int, strategy_bytes: int) -> int:
        """None on a worker: the servers hold the optimizer state, each of its shard."""
        return 0

    def plan_rows(self, s: SyncPlan) -> list[tuple[str, object]]:
        rows: list[tuple[str, object]] = [("workers (ranks)", ", ".join(map(str, s.workers)))]
        for srv in s.servers:
            held = f"~{srv.params:,} params, optimizer {srv.optimizer_bytes / 2**20:,.1f} MiB"
            rows.append((f"server {srv.shard} (rank {srv.rank})", held))
        rows.append(("max staleness (steps)", s.max_staleness))
        return rows

    def sync_plan(self, cfg: DtrainConfig, facts: ModelFacts, ddp_bytes: int) -> SyncPlan:
        sync, dp, n = cfg.sync, cfg.parallel.dp, facts.num_params
        sizes = shard_sizes(n, sync.servers)
        words = len(optim_slots(cfg))
        servers = [
            ServerPlan(rank=dp + i, shard=i, params=s, optimizer_bytes=4 * words * s)
            for i, s in enumerate(sizes)
        ]
        header = 4 * HEADER_WORDS
        per_worker = 4 * n + header * sync.servers
        per_server = dp * (4 * max(sizes) + header)
        worker = {"sent": per_worker, "received": per_worker}
        server = {"sent": per_server, "received": per_server}
        return SyncPlan(
            mode=self.name,
            workers=list(range(dp)),
            servers=servers,
            max_staleness=sync.max_staleness,
            bytes_per_step={"worker": worker, "server": server},
            ddp_bytes_per_step=ddp_bytes,
        )
