"""Build a model without allocating it, then allocate only this rank's part.

    dtrain launch recipe=gpt_small dp=2 pp=2       # each stage allocates its own layers only
    dtrain simulate recipe=gpt_1b dp=64 tp=8 pp=2  # each rank allocates its shards only

:func:`deferred_build` runs the model's own constructor (``ModelSpec.build``, seeded as
:func:`.parallelize.build_model` seeds it) with every parameter moved to the meta device as
it is registered: buffers stay real, parameters take no memory. Every in-place op the
constructor applies to a meta parameter (``normal_``, ``uniform_``, ``fill_``, ``zero_``,
...) is recorded with the RNG state before it, and a random op is also run once on a
scratch tensor of the same shape so the generator advances exactly as in a full build.

- :func:`replay_init` (a launch's pipeline stage) allocates a part's parameters and replays
  their recorded ops: the same values as the full model's, bit for bit, with only the
  stage's layers (plus one scratch tensor at a time) ever allocated. It returns False when
  the constructor did something it cannot replay; the caller then builds the full model.
- :func:`allocate_local` (``dtrain simulate``) allocates the local shards of an already
  parallelized part (``to_empty``: FSDP2 and DTensor shards) with placeholder values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dtrain_cli.runtime.parallel.dtensors import local_tensor

_RANDOM = {"normal_", "uniform_", "bernoulli_", "exponential_", "random_", "geometric_"}


@dataclass(kw_only=True)
class InitRecord:
    """What a deferred build did to each meta parameter, by storage."""

    ops: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    unreplayable: set[int] = field(default_factory=set)
    by_name: dict[str, int] = field(default_factory=dict)
    """The full model's parameter names -> storage (a stage may hold copies of them)."""
    alive: dict[int, torch.Tensor] = field(default_factory=dict)
    """Every recorded meta tensor, held so that its storage's address (the key) is not
    reused while the record lives: a layer the constructor replaced (``self.head = ...``
    twice, a tied ``head.weight``) freed its parameters, and a later parameter at the same
    address took their ops (a shape out of bounds at start-up, or wrong values)."""

    def ops_of(self, name: str, p: torch.Tensor) -> list[tuple[Any, ...]] | None:
        """The recorded ops of a parameter, or None when they cannot be replayed."""
        key = p.untyped_storage()._cdata
        if key not in self.ops:
            key = self.by_name.get(name, -1)
        return None if key in self.unreplayable else self.ops.get(key)


def _op_name(func: Any) -> str:
    return func._schema.name.split("::")[-1]


class _Recorder(TorchDispatchMode):
    """Records in-place ops on meta tensors; advances the CPU RNG for random ones."""

    def __init__(self, record: InitRecord) -> None:
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        name = _op_name(func)
        target = args[0] if args else None
        if not (isinstance(target, torch.Tensor) and target.is_meta and name.endswith("_")):
            return func(*args, **kwargs)
        key = target.untyped_storage()._cdata
        self.record.alive.setdefault(key, target)
        rest = args[1:]
        if any(isinstance(a, torch.Tensor) and a.is_meta for a in (*rest, *kwargs.values())):
            self.record.unreplayable.add(key)  # computed from other meta tensors
            return func(*args, **kwargs)
        state = torch.get_rng_state() if name in _RANDOM else None
        if state is not None:  # the same draws a full build makes, on a scratch tensor
            func(torch.empty(target.shape, dtype=target.dtype), *rest, **kwargs)
        geometry = (tuple(target.shape), tuple(target.stride()), target.storage_offset())
        self.record.ops.setdefault(key, []).append((func, geometry, rest, kwargs, state))
        return target


@contextlib.contextmanager
def _parameters_on_meta(record: InitRecord) -> Iterator[None]:
    """Parameters become meta as modules register them (their values, when already
    written, are kept as a recorded copy); buffers stay where they are."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is None or param.is_meta:
            return
        meta = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        module._parameters[name] = meta
        record.alive[meta.untyped_storage()._cdata] = meta
        if param.untyped_storage()._cdata not in _Fresh.storages:  # written already
            geometry = (tuple(meta.shape), tuple(meta.stride()), 0)
            key = meta.untyped_storage()._cdata
            record.ops[key] = [(None, geometry, (param.detach().clone(),), {}, None)]

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


class _Fresh(TorchDispatchMode):
    """Notes storages ``torch.empty`` made that nothing has written yet."""

    storages: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        out = func(*args, **(kwargs or {}))
        name = _op_name(func)
        if name in ("empty", "empty_strided") and isinstance(out, torch.Tensor):
            _Fresh.storages.add(out.untyped_storage()._cdata)
            return out
        if args and isinstance(args[0], torch.Tensor) and name.endswith("_"):
            _Fresh.storages.discard(args[0].untyped_storage()._cdata)
        if isinstance(out, torch.Tensor) and not out.is_meta:  # written, maybe at the address
            _Fresh.storages.discard(out.untyped_storage()._cdata)  # of a freed empty one
        return out


def deferred_build(spec: Any, seed: int, replayable: bool = True) -> tuple[nn.Module, InitRecord]:
    """The model with its parameters on the meta device, and how to fill them in
    (``replayable=False``: values do not matter, nothing recorded, no RNG draws)."""
    record = InitRecord()
    _Fresh.storages = set()
    recording = (_Fresh(), _Recorder(record)) if replayable else ()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with _parameters_on_meta(record), contextlib.ExitStack() as stack:
            for mode in recording:
                stack.enter_context(mode)
            model = spec.build("cpu")
    _Fresh.storages = set()
    record.by_name = {n: p.untyped_storage()._cdata for n, p in model.named_parameters()}
    return model, record


def replay_init(parts: list[nn.Module], record: InitRecord, device: torch.device) -> bool:
    """Allocate the parts' meta parameters on ``device`` with the full build's values."""
    todo = []
    for i, part in enumerate(parts):
        for name, p in part.named_parameters():
            ops = record.ops_of(name, p) if p.is_meta else []
            if ops is None:
                return False
            todo.append((i, name, ops))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for part in parts:  # new parameter objects; tied ones stay one (to_empty split them)
            _new_empty_parameters(part, torch.device("cpu"))
        named = [dict(part.named_parameters()) for part in parts]
        for i, name, ops in todo:
            _replay(named[i][name].data, ops)
    for part in parts:
        part.to(device)
    return True


def _replay(real: torch.Tensor, ops: list[tuple[Any, ...]]) -> None:
    for func, (shape, stride, offset), rest, kwargs, state in ops:
        view = real.as_strided(shape, stride, offset)
        if func is None:  # values written before the parameter was registered
            view.copy_(rest[0])
            continue
        if state is not None:
            torch.set_rng_state(state)
        func(view, *rest, **kwargs)


def allocate_local(parts: list[nn.Module], device: torch.device) -> None:
    """Allocate what this rank holds of each part (local shards of sharded parameters)
    with placeholder values: a simulation runs shapes and code paths, not numerics."""
    with torch.no_grad():
        for part in parts:
            _to_empty(part, device)
            for p in part.parameters():
                local = local_tensor(p)
                if local.is_floating_point():
                    local.normal_(0.0, 0.02)


def _to_empty(part: nn.Module, device: torch.device) -> None:
    """``to_empty`` for the parameters; real buffers (rotary tables...) keep their values."""
    buffers = {n: b for n, b in part.named_buffers() if not b.is_meta}
    if _fake_plain_parameters(part):
        _new_empty_parameters(part, device)
    else:
        part.to_empty(device=device)
    with torch.no_grad():
        for name, b in part.named_buffers():
            if name in buffers:
                b.copy_(buffers[name].to(device))


def _fake_plain_parameters(part: nn.Module) -> bool:
    """Plain parameters built under ``FakeTensorMode`` (``simulate --compute fake`` before
    DDP, which wraps them unsharded): ``to_empty`` would swap them in place, which the fake
    mode's own weak references to them forbid."""
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(p, FakeTensor) for p in part.parameters())


def _new_empty_parameters(part: nn.Module, device: torch.device) -> None:
    """New (fake) parameter objects of the same shapes on ``device`` for those still on the
    meta device (one already allocated is kept: DDP's reducer holds it); a parameter shared
    by two modules (tied weights) stays one parameter."""
    made: dict[int, nn.Parameter] = {}
    for module in part.modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_meta:
                continue
            if id(p) not in made:
                empty = torch.empty_like(p, device=device)
                made[id(p)] = nn.Parameter(empty, requires_grad=p.requires_grad)
            module._parameters[name] = made[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_meta:
                module._buffers[name] = torch.empty_like(b, device=device)
