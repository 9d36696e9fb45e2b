"""torch's ``DistributedDataParallel`` on fake tensors (``dtrain simulate --compute fake``).

DDP's C++ reducer keeps its bookkeeping in small integer tensors it reads element by
element: the parameter shapes it checks across ranks when it is built
(``_verify_param_shape_across_processes``) and the bucket indices it broadcasts when it
rebuilds its buckets before the second forward (``Reducer::sync_bucket_indices``). Under
``FakeTensorMode`` those tensors are fake, hold no data, and DDP stops ("its data is not
allocated yet"). :class:`RealBookkeeping` runs on real tensors every op whose tensor inputs
are all real, and the integer ``empty`` that creates them; whatever touches the model's
parameters, gradients or DDP's float buckets stays fake, so nothing of the model's size is
allocated. The collectives on those integer tensors go to the fake process group like any
other: they are the ones a launched rank makes at the same points.

    with RealBookkeeping():
        ddp = DistributedDataParallel(model, ...)
    keep_bookkeeping_real(ddp)
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

INDEX_DTYPES = (torch.int32, torch.int64)


class RealBookkeeping(TorchDispatchMode):
    """Ops on real tensors only (and integer ``empty``) run outside ``FakeTensorMode``; the
    rest go on to it. Without a fake mode around, every op runs as it would anyway."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if tensors:
            real = not any(isinstance(t, FakeTensor) for t in tensors)
        else:
            real = func is torch.ops.aten.empty.memory_format and (
                kwargs.get("dtype") in INDEX_DTYPES
            )
        if real:
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def keep_bookkeeping_real(ddp: torch.nn.Module) -> None:
    """Every forward's preparation (where the reducer rebuilds its buckets) under
    :class:`RealBookkeeping`."""
    prepare = ddp._pre_forward

    def pre_forward(*args: Any, **kwargs: Any) -> Any:
        with RealBookkeeping():
            return prepare(*args, **kwargs)

    ddp._pre_forward = pre_forward  # type: ignore[method-assign]
