"""Process group and DeviceMesh for one worker, from the env the elastic agent sets.

Each restart attempt of the elastic agent gets its own store namespace
(``PrefixStore("dtrain/attempt_<n>", agent_store)``): on gloo, a restarted group that
reuses the previous attempt's keys can hang forever in ProcessGroupGloo init.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from dtrain_cli.mesh.dims import MESH_DIM_NAMES, ParallelDims
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env
from dtrain_cli.runtime.parallel import group_lifetime


@dataclass(kw_only=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    restart_count: int
    device: torch.device
    mesh: DeviceMesh
    dims: ParallelDims
    role: str = "worker"
    """worker | server (sync.mode=param_server: ranks after the mesh, no mesh of their own)."""
    ps: Any = None
    """param_server: the gloo group of workers and servers for point-to-point messages."""
    simulated: bool = False
    """``dtrain simulate``: a fake process group; the model is built on the meta device and
    only this rank's shards are allocated (:mod:`.materialize`)."""

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The dp axis: a dim of the mesh, or (hsdp) its (dp_replicate, dp_shard) dims
        flattened by :func:`build_mesh` (``_flatten`` returns the one it made; torch
        deprecates slicing a flattened dim from the root mesh)."""
        if self.dims.dp_replicate_enabled:
            return self.mesh["dp_replicate", "dp_shard"]._flatten("dp")
        return self.mesh["dp"]

    @property
    def dp_rank(self) -> int:
        return self.dp_mesh.get_local_rank()

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.dp_mesh.get_group()

    def shard_mesh(self) -> DeviceMesh:
        """The mesh a sharding strategy shards over: dp, or (dp_replicate, dp_shard) when
        dp is split into replicated shard groups (hsdp)."""
        if self.dims.dp_replicate_enabled:
            return self.mesh["dp_replicate", "dp_shard"]
        return self.dp_mesh

    @property
    def is_logging_rank(self) -> bool:
        return self.rank == 0


def init_distributed(plan: Plan, timeout_s: float = 300.0) -> DistContext:
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    restart = env.restart_count()
    if world_size != plan.world_size:
        raise RuntimeError(
            f"the launcher started {world_size} workers but the plan needs {plan.world_size}"
        )
    if plan.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    if plan.sync is not None and plan.sync.servers:
        return _init_param_server(plan, rank, local_rank, restart, device, timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.PrefixStore(f"dtrain/attempt_{restart}", _agent_store(timeout))
        dist.init_process_group(
            plan.backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    else:
        dist.init_process_group(plan.backend, rank=rank, world_size=world_size, timeout=timeout)
    mesh = build_mesh(plan, device)
    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        restart_count=restart,
        device=device,
        mesh=mesh,
        dims=plan.dims,
    )


def build_mesh(plan: Plan, device: torch.device) -> DeviceMesh:
    """``init_device_mesh`` over (pp, dp, tp); with dp split (hsdp) over (pp, dp_replicate,
    dp_shard, tp), its two dp axes flattened into ``dp`` as well, so every other part of
    the runtime reads the same dp axis (:attr:`DistContext.dp_mesh`)."""
    dims = plan.dims
    if not dims.dp_replicate_enabled:
        return init_device_mesh(
            device.type, tuple(plan.mesh.shape), mesh_dim_names=tuple(plan.mesh.dim_names)
        )
    mesh = init_device_mesh(
        device.type,
        (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp),
        mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"),
    )
    mesh["dp_replicate", "dp_shard"]._flatten("dp")  # private in torch 2.x: no public flatten
    return mesh


def _agent_store(timeout: timedelta) -> dist.Store:
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timeout,
        )
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=int(os.environ["RANK"]) == 0,
        timeout=timeout,
    )


def _init_param_server(
    plan: Plan, rank: int, local_rank: int, restart: int, device: torch.device, timeout: timedelta
) -> DistContext:
    """Workers get a default group (and mesh) of their own, servers theirs: every
    collective of the loop runs among workers only. Both join one more gloo group for the
    point-to-point messages of :mod:`.param_server`."""
    assert plan.sync is not None
    base = dist.PrefixStore(f"dtrain/attempt_{restart}", _agent_store(timeout))
    dp, servers = len(plan.sync.workers), len(plan.sync.servers)
    role = "worker" if rank < dp else "server"
    own, size = (rank, dp) if role == "worker" else (rank - dp, servers)
    dist.init_process_group(
        plan.backend,
        store=dist.PrefixStore(role, base),
        rank=own,
        world_size=size,
        timeout=timeout,
    )
    ps = dist.ProcessGroupGloo(dist.PrefixStore("ps", base), rank, dp + servers, timeout)
    mesh = build_mesh(plan, device) if role == "worker" else None
    return DistContext(
        rank=rank,
        world_size=size,
        local_rank=local_rank,
        restart_count=restart,
        device=device,
        mesh=mesh,  # type: ignore[arg-type]
        dims=plan.dims,
        role=role,
        ps=ps,
    )


def mesh_coordinates(ctx: DistContext) -> dict[str, int]:
    """This rank's coordinate on each named mesh axis (compared with the plan in tests)."""
    if ctx.mesh is None:  # a parameter server
        return {}
    axis = {name: ctx.dp_mesh if name == "dp" else ctx.mesh[name] for name in MESH_DIM_NAMES}
    return {name: mesh.get_local_rank() for name, mesh in axis.items()}


def shutdown_distributed() -> None:
    """Every group destroyed; kept alive until the process exits, so the model's DDP
    reducer, freed later with the GIL held, never destroys one (:mod:`.group_lifetime`)."""
    if dist.is_initialized():
        group_lifetime.destroy_process_group()
