"""Process group and DeviceMesh for one worker, from the env the elastic agent sets.

Each restart attempt of the elastic agent gets its own store namespace
(``PrefixStore("dtrain/attempt_<n>", agent_store)``): on gloo, a restarted group that
reuses the previous attempt's keys can hang forever in ProcessGroupGloo init.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from dtrain_cli.plan.plan import Plan


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    restart_count: int
    device: torch.device
    mesh: DeviceMesh

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
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
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
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        agent_store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timeout,
        )
        store = dist.PrefixStore(f"dtrain/attempt_{restart}", agent_store)
        dist.init_process_group(
            plan.backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    else:
        dist.init_process_group(plan.backend, rank=rank, world_size=world_size, timeout=timeout)
    mesh = init_device_mesh(
        device.type, tuple(plan.mesh.shape), mesh_dim_names=tuple(plan.mesh.dim_names)
    )
    return DistContext(rank, world_size, local_rank, restart, device, mesh)


def mesh_coordinates(ctx: DistContext) -> dict[str, int]:
    """This rank's coordinate on each named mesh axis (compared with the plan in tests)."""
    return {name: ctx.mesh[name].get_local_rank() for name in ctx.mesh.mesh_dim_names or ()}


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
