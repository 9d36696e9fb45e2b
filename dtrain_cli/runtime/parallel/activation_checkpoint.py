"""Activation checkpointing: blocks keep only their input and recompute the rest in backward.

    dtrain launch recipe=gpt_small dp=2 parallel.activation_checkpointing=full
    dtrain launch recipe=gpt_small pp=2 parallel.activation_checkpointing=selective

``parallel.activation_checkpointing``: ``none`` | ``selective`` | ``full``. The blocks are
those of the model's spec (:meth:`ModelSpec.blocks`: the GPT's transformer layers, a custom
model's largest ``nn.ModuleList``). ``full`` checkpoints every block; ``selective``
checkpoints every other one, the 2nd, 4th, ... block of the *whole* model (torchtitan's
layer-wise selective AC with frequency 2), counted by the block's global index so that a
pipeline stage checkpoints the same blocks as the unsplit model.

Each chosen block's ``forward`` is replaced, on that instance, by
``torch.utils.checkpoint.checkpoint(forward, ..., use_reentrant=False)`` (the function torch's
``checkpoint_wrapper`` calls). Unlike ``checkpoint_wrapper`` this adds no
``_checkpoint_wrapped_module`` level, so parameter names, optimizer state keys and DCP
checkpoints are those of the plain model, and a checkpoint loads into any layout with or
without checkpointing. Applied after tensor parallel and before compile and FSDP/DDP
(torchtitan's order), so FSDP's hooks wrap the recomputing block and gather its parameters
again for the recomputation. RNG state is replayed (``preserve_rng_state``), so dropout
draws the same masks and the loss is identical to no checkpointing. A block with BatchNorm
(or another norm that tracks running statistics) gets its statistics back after the
recomputation, which would count each batch twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

from dtrain_cli.plan.layout import checkpointed_layers


def apply_activation_checkpointing(
    model: nn.Module, blocks: list[nn.Module], mode: str, first_index: int = 0
) -> list[int]:
    """Checkpoint, in place, the ``blocks`` of ``model`` that ``mode`` chooses
    (:func:`dtrain_cli.plan.layout.checkpointed_layers`, the plan's own choice);
    ``first_index`` is the global index of the first block (a pipeline stage's first
    layer). Returns the global indices checkpointed."""
    chosen = checkpointed_layers(first_index, first_index + len(blocks), mode)
    for i in chosen:
        _checkpoint_forward(blocks[i - first_index])
    return chosen


def _checkpoint_forward(block: nn.Module) -> None:
    inner: Callable[..., Any] = block.forward
    stats = [m for m in block.modules() if isinstance(m, _NormBase) and m.track_running_stats]
    extra: dict[str, Any] = {}
    if stats:  # the recomputation is a second forward: BatchNorm would count the batch twice
        extra["context_fn"] = lambda: (contextlib.nullcontext(), _running_stats_kept(stats))

    def forward(*args: Any, **kwargs: Any) -> Any:
        # compiled, the recomputation is part of the traced graph (no second update), and
        # a context_fn must give TorchDispatchModes there
        ctx = {} if torch.compiler.is_compiling() else extra
        return checkpoint(
            inner, *args, use_reentrant=False, preserve_rng_state=True, **ctx, **kwargs
        )

    block.forward = forward  # type: ignore[method-assign]
    block._dtrain_checkpointed = True  # type: ignore[assignment]


@contextlib.contextmanager
def _running_stats_kept(modules: list[nn.Module]) -> Iterator[None]:
    """Run the recomputation with the running statistics (running mean and variance, the
    batch count) of ``modules`` put back after it: a BatchNorm in a checkpointed block
    updated them twice a step (``num_batches_tracked`` 12 after 6 steps, and the running
    variance, which evaluation and an export use, off). The recomputed forward normalizes
    with the batch's own statistics, as the first did, so the gradients are unchanged."""
    kept = [[b.detach().clone() for b in m.buffers(recurse=False)] for m in modules]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, saved in zip(modules, kept, strict=True):
                for b, old in zip(m.buffers(recurse=False), saved, strict=True):
                    b.copy_(old)


def is_checkpointed(block: nn.Module) -> bool:
    return bool(getattr(block, "_dtrain_checkpointed", False))


class SavedTensorMeter:
    """Bytes kept alive for backward by one forward, counted exactly: every tensor autograd
    saves (``torch.autograd.graph.saved_tensors_hooks``) and the inputs a checkpointed block
    keeps for its recomputation, each storage once; parameters (which autograd also saves)
    are not activations and are left out.

        with SavedTensorMeter(model, blocks) as meter:
            loss = loss_fn(model(x), y)
        meter.bytes
    """

    def __init__(self, model: nn.Module, blocks: list[nn.Module] | None = None) -> None:
        self.storages: dict[int, int] = {}
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._hooks: list[Any] = []
        self._blocks = [b for b in blocks or [] if is_checkpointed(b)]
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def _count(self, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            if st.data_ptr() not in self._params:
                self.storages[st.data_ptr()] = st.nbytes()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._count(t)
        return t

    def _pre_hook(self, _module: nn.Module, args: tuple, kwargs: dict) -> None:
        if torch.is_grad_enabled():
            for a in (*args, *kwargs.values()):
                self._count(a)

    def __enter__(self) -> SavedTensorMeter:
        self._hooks = [
            b.register_forward_pre_hook(self._pre_hook, with_kwargs=True) for b in self._blocks
        ]
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)
        for h in self._hooks:
            h.remove()
