"""``debug.check_collectives``: torch's collective fingerprint checks, named in one line.

    dtrain launch recipe=gpt_small dp=4 debug.check_collectives=true
    # error: rank 0 failed (exit code 1): CollectiveMismatch: ranks run different
    #   collectives: rank 1 ALLREDUCE shape [15] Float, rank 0 ALLREDUCE shape [14] Float
    #   (dtrain's all_reduce #2, step 4, logging)

TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every process group created afterwards in torch's
checking wrapper (gloo and NCCL): before each collective the ranks compare op, shapes,
dtypes and sequence number, and a mismatch raises at once on every rank instead of a
hang or gloo's abort. DDP crashes while logging its construction on such a group (torch
2.13, SIGSEGV): DDP gets the same ranks in an unwrapped group, so its bucket all-reduces
are the ones collectives not fingerprinted.
"""

from __future__ import annotations

import os
import re

import torch
import torch.distributed as dist

from dtrain_cli.runtime.diagnostics.watchdog import COLLECTIVES

MISMATCH = "Detected mismatch between collectives on ranks"
_PRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), "
    r"OpType=(\w+), TensorShape=\[([^\]]*)\], TensorDtypes=(\w+)"
)


class CollectiveMismatch(RuntimeError):
    """Ranks called different collectives (op, shape, dtype or order)."""


def enable(enabled: bool) -> None:
    """Before the process group exists. torch reads the variable when
    ``torch.distributed`` is imported (the fork server did that): set it and re-read."""
    if not enabled:
        return
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level_from_env()


def explain(message: str) -> str | None:
    """torch's mismatch error in one line (None when it is not one)."""
    if MISMATCH not in message:
        return None
    seen = []
    for rank, _seq, op, shape, dtype in _PRINT.findall(message):
        text = f"rank {rank} {op} shape [{shape}] {dtype}"
        if text not in seen:
            seen.append(text)
    where = ""
    if COLLECTIVES.count:
        c = COLLECTIVES
        where = f" (dtrain's last: {c.op} #{c.count}, step {c.step}, {c.what})"
    return f"ranks run different collectives: {', '.join(seen) or message[:200]}{where}"


def unwrapped_group(mesh: object, group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The dp group again without torch's checking wrapper (for DDP, see above); every rank
    creates every dp group (``new_subgroups_by_enumeration`` is collective)."""
    if dist.get_debug_level() != dist.DebugLevel.DETAIL:
        return group
    grid: torch.Tensor = mesh.mesh  # type: ignore[attr-defined]
    names = list(mesh.mesh_dim_names or ())  # type: ignore[attr-defined]
    axis = names.index("dp")
    groups = grid.movedim(axis, -1).reshape(-1, grid.shape[axis]).tolist()
    dist.set_debug_level(dist.DebugLevel.OFF)
    try:
        mine, _ = dist.new_subgroups_by_enumeration(groups)
    finally:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    return mine
