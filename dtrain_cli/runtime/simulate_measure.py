"""What a simulated rank holds and sends (:mod:`.simulate`): storage accounting, no allocator.

    python -m dtrain_cli.runtime.simulate RUN_DIR --rank 0 --out rank_0.json

- :func:`tensor_bytes`: this rank's bytes of a tensor (a DTensor's local shard).
- :func:`storage_bytes`: the bytes this rank allocates for some tensors, each storage once
  (FSDP2's padded shards, its gradients' shared reduce-scatter output, DDP's buckets).
- :class:`SavedBytesMeter`: every storage autograd saves for backward during a step, each
  once, parameters left out (``saved_tensors_hooks``, as the plan's activation estimate
  counts them).
- :class:`CommCounter`: every collective of the process-group API and of DTensor's
  functional collectives (a dispatch mode on the ``c10d`` ops), by op and mesh axis, with
  the bytes a ring moves per rank for it: 2 (n-1)/n x buffer for an all-reduce, (n-1)/n x
  the whole buffer for an all-gather or reduce-scatter, or a broadcast (a chain forwards the
  buffer on every rank but its last: (n-1)/n of it on average), the buffer for a send;
  and a parameter server's worker's sends to its servers (:class:`CountedGroup`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from dtrain_cli.models.saved_bytes import weight_derived
from dtrain_cli.runtime.parallel.dtensors import is_dtensor, local_tensor
from dtrain_cli.runtime.parallel.mesh import DistContext


def tensor_bytes(t: torch.Tensor, count: bool = False) -> int:
    """Bytes (or elements, ``count``) this rank holds of ``t``."""
    local = local_tensor(t)
    return local.numel() * (1 if count else local.element_size())


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages ``tensors`` (their local shards) live in, each storage once:
    what the rank allocates for them. FSDP2 pads every rank's shard of a parameter to the
    largest one's rows (``FSDPParam._init_sharded_param``), so a rank past a tensor's last
    rows holds none of its elements in a storage of the full chunk; its gradients are
    views of one reduce-scatter output per group, DDP's (``gradient_as_bucket_view``) of
    its buckets."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t._local_tensor if is_dtensor(t) else t
        try:
            st = local.untyped_storage()
            seen.setdefault(st._cdata, st.nbytes())
        except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
            seen.setdefault(id(local), local.numel() * local.element_size())
    return sum(seen.values())


class SavedBytesMeter:
    """Bytes of the storages autograd keeps for backward, summed over the steps it wraps
    (``peak_step_bytes``: the largest step). A DTensor counts its local shard; parameters
    and what is made of them alone (a transposed or bf16 copy of a weight, a parameter's
    view) are weights, not activations, and are left out."""

    def __init__(self) -> None:
        self.peak_step_bytes = 0
        self._seen: dict[int, tuple[int, Any]] = {}
        """Storage address -> (bytes, the storage), each kept alive until the step ends: a
        micro-batch's storages are freed after its backward, and a later one's could reuse
        their addresses (the key), which made the count depend on the allocator."""
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not weight_derived(t):
            local = t._local_tensor if is_dtensor(t) else t  # no autograd op in a hook
            try:
                st = local.untyped_storage()
                key, nbytes = st._cdata, st.nbytes()
            except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
                st, key, nbytes = local, id(local), local.numel() * local.element_size()
            self._seen.setdefault(key, (nbytes, st))
        return t

    def __enter__(self) -> SavedBytesMeter:
        self._seen = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        step_bytes = sum(nbytes for nbytes, _ in self._seen.values())
        self.peak_step_bytes = max(self.peak_step_bytes, step_bytes)
        self._seen = {}


_GATHER = ("allgather", "all_gather", "reduce_scatter")
_REDUCE = ("allreduce", "all_reduce")
_OPS = (*_GATHER, *_REDUCE, "broadcast", "send", "recv", "alltoall", "all_to_all", "scatter")


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class CommCounter(TorchDispatchMode):
    """Counts the collectives dispatched while active (``rows()``)."""

    def __init__(self, ctx: DistContext) -> None:
        super().__init__()
        self.calls: dict[tuple[str, str], list[int]] = {}
        self.axes: dict[str, str] = {}
        mesh = ctx.mesh  # None on a parameter server's server
        for name in (mesh.mesh_dim_names or ()) if mesh is not None else ():
            group = mesh[name].get_group()
            self.axes.setdefault(group.group_name, name)
        world = dist.group.WORLD
        if world is not None:
            self.axes.setdefault(world.group_name, "world")
        self.ps = ctx.ps if isinstance(ctx.ps, CountedGroup) else None
        """A parameter server's rank: its group with the servers or workers (calls it counts)."""

    def __enter__(self) -> CommCounter:
        if self.ps is not None:
            self.ps.counter = self
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ps is not None:
            self.ps.counter = None
        super().__exit__(*exc)

    def record(self, op: str, axis: str, n: int, sent: int) -> None:
        row = self.calls.setdefault((op, axis), [0, 0, n])
        row[0] += 1
        row[1] += sent

    def _group(self, args: tuple, kwargs: dict) -> tuple[str, int]:
        from torch.distributed.distributed_c10d import _resolve_process_group

        for a in (*args, *kwargs.values()):
            if isinstance(a, str) and a in self.axes:
                return self.axes[a], _resolve_process_group(a).size()
            if isinstance(a, torch.ScriptObject):
                a = dist.ProcessGroup.unbox(a)
            if isinstance(a, dist.ProcessGroup):
                return self.axes.get(a.group_name, a.group_name), a.size()
        return "?", 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace not in ("c10d", "_c10d_functional"):
            return out
        op = func._schema.name.split("::")[-1].strip("_")
        if not any(k in op for k in _OPS):
            return out
        axis, n = self._group(args, kwargs)
        sides = [_nbytes(_tensors(a)) for a in args[:2]] + [_nbytes(_tensors(out))]
        buffer = max(sides)
        if any(k in op for k in _REDUCE):
            sent = 2 * (n - 1) * buffer // max(n, 1)
        elif any(k in op for k in _GATHER) or "broadcast" in op:
            sent = (n - 1) * buffer // max(n, 1)
        elif "recv" in op:
            sent = 0
        else:
            sent = buffer
        self.record(op, axis, n, sent)
        return out

    def rows(self) -> list[dict[str, Any]]:
        """``{op, axis, group_size, count, bytes_sent}`` per (op, axis)."""
        return [
            {"op": op, "axis": axis, "group_size": n, "count": c, "bytes_sent": b}
            for (op, axis), (c, b, n) in sorted(self.calls.items())
        ]


class CountedGroup:
    """A parameter server's point-to-point group, counted: the runtime calls that group's
    backend directly (``ctx.ps.send``), which no dispatch mode sees, so this wrapper tells
    the active :class:`CommCounter` each send (its buffer) and recv (nothing sent)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.counter: CommCounter | None = None

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        if self.counter is not None:
            self.counter.record("send", "ps", self.backend.size(), _nbytes(tensors))
        return self.backend.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        if self.counter is not None:
            self.counter.record("recv", "ps", self.backend.size(), 0)
        return self.backend.recv(tensors, src, tag)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)
