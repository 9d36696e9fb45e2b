"""Roles and bytes of the asynchronous / low-communication modes. Pure, torch-free.

    dtrain plan recipe=gpt_small dp=4 sync.mode=param_server sync.servers=2
    dtrain plan recipe=gpt_small dp=4 sync.mode=diloco sync.every=16

``param_server``: ranks ``0..dp-1`` are workers (the mesh), ranks ``dp..dp+servers-1``
serve parameter shards (whole tensors, balanced by size). Per step a worker sends its
gradient (4 B per parameter) and receives the parameters back; a server receives and sends
``dp`` times its shard. ``diloco``: one ring all-reduce of the parameter delta every
``every`` steps, amortized per step (about ``every`` times less than DDP).
"""

from __future__ import annotations

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models.spec import ModelFacts
from dtrain_cli.plan.plan import ServerPlan, SyncPlan

HEADER_WORDS = 4
"""fp32 words in front of every message (step, version read, kind, norm): runtime/param_server.py"""
PS_STRATEGIES = "parallel.strategy=ddp, tp=1, pp=1, one node, run.device=cpu"


def num_servers(cfg: DtrainConfig) -> int:
    """Processes the launcher starts in addition to dp*tp*pp."""
    return cfg.sync.servers if cfg.sync.mode == "param_server" else 0


def sync_problems(cfg: DtrainConfig, device: str, problems: list[str]) -> None:
    """What param_server and diloco combine with (strategy_problems has the rest)."""
    par, sync = cfg.parallel, cfg.sync
    if sync.mode == "param_server":
        if par.strategy != "ddp" or par.tp > 1 or par.pp > 1:
            problems.append(
                f"sync.mode=param_server: parameters and optimizer state live on the servers, "
                f"so it does not combine with strategy={par.strategy}, tp={par.tp}, "
                f"pp={par.pp}; supported: {PS_STRATEGIES}"
            )
        if max(par.nnodes, 1) > 1 or device != "cpu":
            problems.append(
                f"sync.mode=param_server: gloo point-to-point on CPU tensors, one node "
                f"(got nnodes={par.nnodes}, device={device}); supported: {PS_STRATEGIES}"
            )
        if cfg.comm.compression != "none":
            problems.append(
                f"comm.compression={cfg.comm.compression}: the parameter server sends full "
                f"fp32 gradients; use comm.compression=none"
            )
        if cfg.precision.name == "fp16":
            problems.append("sync.mode=param_server: no loss scaling on the servers; use fp32/bf16")
        if cfg.checkpoint.async_save:
            problems.append(
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
            problems.append(
                f"{', '.join(per_step)}: the servers apply every pushed gradient, so an update "
                "cannot be skipped or rolled back on the workers; use stop with param_server"
            )
        want = par.dp * par.tp * par.pp + sync.servers
        if par.nproc_per_node is not None and par.nproc_per_node * max(par.nnodes, 1) != want:
            problems.append(
                f"sync.servers={sync.servers}: dp + servers = {par.dp} + {sync.servers} = {want} "
                f"processes but nproc_per_node={par.nproc_per_node}; set "
                f"nproc_per_node={want} or drop it"
            )
    if sync.mode == "diloco":
        if par.min_nnodes is not None and par.min_nnodes < par.nnodes:
            problems.append(
                f"parallel.nnodes={par.min_nnodes}:{par.nnodes}: DiLoCo checkpoints hold "
                "each replica's inner parameters, so it resumes at the same dp only; use a "
                "fixed node count with sync.mode=diloco"
            )
        if par.strategy != "ddp" or par.tp > 1 or par.pp > 1:
            problems.append(
                f"sync.mode=diloco: replicas step alone between outer steps; needs "
                f"strategy=ddp with tp=1 and pp=1 (got strategy={par.strategy}, tp={par.tp}, "
                f"pp={par.pp})"
            )
        if cfg.comm.compression != "none":
            problems.append(
                f"comm.compression={cfg.comm.compression}: DiLoCo all-reduces the fp32 "
                f"parameter delta; use comm.compression=none"
            )


def server_count_problems(cfg: DtrainConfig, facts: ModelFacts) -> list[str]:
    """Each server needs at least one parameter tensor to hold (whole tensors are sharded)."""
    matrices = len(facts.matrix_shapes)
    if cfg.sync.mode != "param_server" or not matrices or cfg.sync.servers <= matrices:
        return []
    return [
        f"sync.servers={cfg.sync.servers}: the model has {matrices} weight matrices to shard "
        f"between servers (whole tensors each); use at most {matrices}"
    ]


def shard_sizes(num_params: int, servers: int) -> list[int]:
    """The plan's estimate of each server's share (the runtime balances whole tensors)."""
    base, extra = divmod(num_params, servers)
    return [base + (1 if i < extra else 0) for i in range(servers)]


def sync_plan(cfg: DtrainConfig, facts: ModelFacts, ddp_bytes: int) -> SyncPlan | None:
    sync, dp = cfg.sync, cfg.parallel.dp
    n = facts.num_params
    if sync.mode == "param_server":
        sizes = shard_sizes(n, sync.servers)
        servers = [ServerPlan(rank=dp + i, shard=i, params=s) for i, s in enumerate(sizes)]
        header = 4 * HEADER_WORDS
        worker = {"sent": 4 * n + header * sync.servers, "received": 4 * n + header * sync.servers}
        per_server = max(sizes)
        server = {
            "sent": dp * (4 * per_server + header),
            "received": dp * (4 * per_server + header),
        }
        return SyncPlan(
            mode=sync.mode,
            workers=list(range(dp)),
            servers=servers,
            max_staleness=sync.max_staleness,
            bytes_per_step={"worker": worker, "server": server},
            ddp_bytes_per_step=ddp_bytes,
        )
    if sync.mode == "diloco":
        ring = int(2 * (dp - 1) / dp * 4 * n / sync.every) if dp > 1 else 0
        return SyncPlan(
            mode=sync.mode,
            workers=list(range(dp)),
            every=sync.every,
            outer_lr=sync.outer_lr,
            outer_momentum=sync.outer_momentum,
            bytes_per_step={"worker": {"sent": ring, "received": ring}},
            ddp_bytes_per_step=ddp_bytes,
        )
    return None


def sync_rows(plan_sync: SyncPlan) -> list[tuple[str, object]]:
    """``dtrain plan`` rows: who serves what, bytes per step per role."""
    s = plan_sync
    rows: list[tuple[str, object]] = [("mode", s.mode)]
    if s.mode == "param_server":
        rows.append(("workers (ranks)", ", ".join(map(str, s.workers))))
        for srv in s.servers:
            rows.append((f"server {srv.shard} (rank {srv.rank})", f"~{srv.params:,} parameters"))
        rows.append(("max staleness (steps)", s.max_staleness))
    else:
        rows.append(
            ("inner steps / outer lr / momentum", f"{s.every} / {s.outer_lr} / {s.outer_momentum}")
        )
    for role, b in s.bytes_per_step.items():
        rows.append((f"{role}: sent / received per step", f"{b['sent']:,} B / {b['received']:,} B"))
    rows.append(("DDP would send per rank per step", f"{s.ddp_bytes_per_step:,} B"))
    return rows
