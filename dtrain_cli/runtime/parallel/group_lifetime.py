"""Process groups outlive ``destroy_process_group`` by one generation, so no rank hangs at exit.

torch 2.13 stashes a Python object (the autograd ``contextvars`` context) in the thread
state that every collective launched during ``backward()`` captures, so gloo's worker
thread needs the GIL to drop a collective it finished. DDP's reducer holds its process
group from C++: when the reducer holds the group's last reference (``destroy_process_group``
then the model going out of scope, the shape of pytorch/examples' DDP scripts), the
group's destructor joins gloo's worker threads *with the GIL held*; if one of them is still
dropping the last allreduce, both wait forever (the pytorch/pytorch#180700 kind of
deadlock; about one ``dtrain run`` in ten of such a script hung here).

:func:`destroy_process_group` destroys the group as torch's function does, then keeps a
Python reference to it. torch binds ``ProcessGroup`` with a holder that releases the GIL in
its destructor, so the last reference dropped is one whose drop cannot deadlock: here, at
the next ``destroy_process_group`` (long after the group's last collective: its worker
threads are idle) or never (a forked rank ends with ``os._exit``; a fresh interpreter
drops it at exit). :func:`install` puts it in ``torch.distributed`` for your own script.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

_kept: list[Any] = []  # the groups the last destroy_process_group destroyed


def destroy_process_group(group: Any = None) -> None:
    """``torch.distributed.destroy_process_group(group)``, the destroyed groups kept one
    generation (those of the previous call are let go here)."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    world = c10d._world
    if group is None or group == c10d.GroupMember.WORLD:
        doomed = list(world.pg_map)
    else:
        doomed = [group] if group in world.pg_map else []
    real = getattr(c10d.destroy_process_group, "__wrapped__", c10d.destroy_process_group)
    real(group)
    _kept[:] = doomed


def kept_groups() -> list[Any]:
    """The groups held past their destruction (what tests compare)."""
    return list(_kept)


def install() -> None:
    """Your script's ``dist.destroy_process_group`` is :func:`destroy_process_group` (only
    when torch.distributed is already imported: a spawn worker's fresh interpreter is left
    as torchrun leaves it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not hasattr(dist, "destroy_process_group"):
        return
    real = dist.destroy_process_group
    if getattr(real, "_dtrain_keeps_groups", False):
        return

    @functools.wraps(real)
    def wrapper(group: Any = None) -> None:
        destroy_process_group(group)

    wrapper._dtrain_keeps_groups = True  # type: ignore[attr-defined]
    dist.destroy_process_group = wrapper
    dist.distributed_c10d.destroy_process_group = wrapper
