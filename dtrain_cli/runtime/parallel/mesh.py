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

from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    restart_count: int
    device: torch.device
    mesh: DeviceMesh
    role: str = "worker"
    """worker | server (sync.mode=param_server: ranks after the mesh, no mesh of their own)."""
    ps: Any = None
    """param_server: the gloo group of workers and servers for point-to-point messages."""

    @property
    def dp_rank(self) -> int:
        return self.mesh["dp"].get_local_rank()

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.mesh["dp"].get_group()

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
    mesh = init_device_mesh(
        device.type, tuple(plan.mesh.shape), mesh_dim_names=tuple(plan.mesh.dim_names)
    )
    return DistContext(rank, world_size, local_rank, restart, device, mesh)


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
    mesh = None
    if role == "worker":
        mesh = init_device_mesh(
            device.type, tuple(plan.mesh.shape), mesh_dim_names=tuple(plan.mesh.dim_names)
        )
    return DistContext(rank, size, local_rank, restart, device, mesh, role, ps)  # type: ignore[arg-type]


def mesh_coordinates(ctx: DistContext) -> dict[str, int]:
    """This rank's coordinate on each named mesh axis (compared with the plan in tests)."""
    if ctx.mesh is None:  # a parameter server
        return {}
    return {name: ctx.mesh[name].get_local_rank() for name in ctx.mesh.mesh_dim_names or ()}


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
