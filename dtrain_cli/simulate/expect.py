"""What one rank of a plan holds, counted exactly from the model's tensor shapes. Torch-free
for the built-in GPT; other kinds give their shapes from a meta build (as their plan does).

    dtrain simulate recipe=gpt_1b dp=64 tp=8 pp=2      # measured vs these counts, per rank

A tensor is on a rank's pipeline stage by where it sits (embeddings, layer i, head); tensor
parallel divides its split dimension by tp (a kind that does not name it leaves the count
approximate under tp); a strategy that shards parameters (fsdp, hsdp) gives each rank its
``torch.chunk`` of dimension 0 over the shard group, as FSDP2 does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dtrain_cli.models.spec import TensorShape, param_shapes
from dtrain_cli.plan.plan import Plan
from dtrain_cli.strategies import strategy_for
from dtrain_cli.sync_modes.param_server import assign_shards

__all__ = [
    "TensorShape",
    "coords_of",
    "default_ranks",
    "rank_params",
    "server_params",
    "stage_share",
    "tensor_shapes",
]

MAX_WORLD = 8192
"""The largest world a simulation builds (its mesh tables grow with it)."""


@dataclass(kw_only=True)
class RankCount:
    params: int
    allocated: int
    """Elements the rank allocates for them: under a strategy that shards parameters
    every rank's shard of a tensor is padded to the first one's rows, as FSDP2 pads it
    (``FSDPParam._init_sharded_param``), so a rank past a tensor's last rows holds none
    of its elements in a storage of a full chunk."""
    exact: bool
    """False when tp > 1 and the model's kind does not say how tp splits each tensor."""


def coords_of(plan: Plan, rank: int) -> dict[str, int]:
    """The rank's coordinate on each mesh axis (row-major over ``plan.mesh``); a parameter
    server's rank (past the mesh): its server index."""
    server = plan.sync.server_of(rank) if plan.sync is not None else None
    if server is not None:
        return {"server": server.shard}
    out, rest = {}, rank
    for name, size in reversed(list(zip(plan.mesh.dim_names, plan.mesh.shape, strict=True))):
        out[name] = rest % size
        rest //= size
    return dict(reversed(list(out.items())))


def default_ranks(plan: Plan) -> list[int]:
    """Rank 0 and the first rank of every other pipeline stage; and the first parameter
    server, if any."""
    servers = plan.sync.servers if plan.sync is not None else []
    workers = plan.world_size - len(servers)
    per_stage = workers // max(plan.dims.pp, 1)
    firsts = [pp * per_stage for pp in range(max(plan.dims.pp, 1))]
    return firsts + [s.rank for s in servers[:1]]


def tensor_shapes(spec: Any) -> tuple[list[TensorShape], bool]:
    """(shapes, whether tp dims are known): the kind's own, else from a meta build."""
    own = getattr(spec, "tensor_shapes", None)
    if own is not None:
        return own(), True
    import torch  # a meta build, as the kind's own plan does

    with torch.device("meta"):
        return param_shapes(spec.build("meta")), False


def _on_stage(t: TensorShape, plan: Plan, pp_rank: int) -> bool:
    if plan.pipeline is None:
        return True
    for st in plan.pipeline.stages:
        if st.pp_rank != pp_rank:
            continue
        if (t.where == "first" and st.embeddings) or (t.where == "last" and st.head):
            return True
        if isinstance(t.where, int) and st.layers[0] <= t.where < st.layers[1]:
            return True
    return False


def _chunk_rows(rows: int, n: int, i: int) -> int:
    """Rows of ``torch.chunk(rows, n)[i]`` (0 past the last chunk)."""
    size = math.ceil(rows / n) if rows else 0
    return max(0, min(size, rows - i * size))


def rank_params(spec: Any, plan: Plan, rank: int) -> RankCount:
    """Parameters ``rank`` holds under ``plan`` (its stage, tp shard and dp shard)."""
    shapes, tp_known = tensor_shapes(spec)
    c = coords_of(plan, rank)
    tp = plan.dims.tp
    strategy = strategy_for(plan.strategy)
    shard_n = plan.dims.dp // max(plan.mesh.dp_replicate, 1) if strategy.shards_params else 1
    shard_i = c.get("dp", 0) % shard_n
    total = allocated = 0
    for t in shapes:
        if not _on_stage(t, plan, c.get("pp", 0)):
            continue
        shape = list(t.shape)
        if tp > 1 and t.tp_dim is not None:
            shape[t.tp_dim] //= tp
        padded = math.prod(shape)
        if shard_n > 1 and shape:
            padded = _chunk_rows(shape[0], shard_n, 0) * math.prod(shape[1:])
            shape[0] = _chunk_rows(shape[0], shard_n, shard_i)
        total += math.prod(shape)
        allocated += padded
    return RankCount(params=total, allocated=allocated, exact=tp_known or tp == 1)


def stage_share(spec: Any, plan: Plan, rank: int) -> float:
    """This rank's pp rank's parameters (after tp) against the pp rank holding the most,
    whose figures the plan's estimates are (:func:`dtrain_cli.plan.memory.held_by_pp_rank`):
    1.0 without a pipeline."""
    from dtrain_cli.plan.memory import held_by_pp_rank

    if plan.pipeline is None or not plan.pipeline.stages:
        return 1.0
    held = held_by_pp_rank(spec.facts(), plan.dims.tp, plan.pipeline)
    return held.get(coords_of(plan, rank).get("pp", 0), 0.0) / max(max(held.values()), 1e-30)


def server_params(spec: Any, plan: Plan, rank: int) -> int:
    """Parameters parameter server ``rank`` holds: whole tensors, balanced as the runtime
    balances them (:func:`.assign_shards`; its loads depend only on the tensors' sizes)."""
    server = plan.sync.server_of(rank) if plan.sync is not None else None
    assert plan.sync is not None and server is not None
    sizes = [math.prod(t.shape) for t in tensor_shapes(spec)[0]]
    mine = assign_shards(sizes, len(plan.sync.servers))[server.shard]
    return sum(sizes[i] for i in mine)
