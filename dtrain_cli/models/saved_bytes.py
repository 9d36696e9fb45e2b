"""What autograd keeps for backward in one forward of one sample, measured on the meta device.

    dtrain plan model=custom model._target_=my_models.lm.TinyLM model.block_size=64   # activations

A model of your own has no formula for its activations: the plan runs its forward (and the
loss) once on the meta device, with one sample of the token windows it will train on, and
counts every tensor autograd saves (``torch.autograd.graph.saved_tensors_hooks``), each
storage once, parameters and their copies (autocast's bf16 weights) left out, split between
the repeated blocks and the rest. No memory, no compute; imports torch (the custom kind's
plan does already).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True)
class SavedBytes:
    """Bytes saved for backward by one sample: floating-point (they scale with the
    activation dtype) and the rest (token ids), in the blocks and outside them."""

    block_float: float
    """Per block (the blocks' total over their number)."""
    block_other: float
    outside_float: float
    outside_other: float
    block_input: float
    """A block's input (what a checkpointed block keeps), floating-point bytes."""
    block_replicated: float = 0.0
    """Of ``block_float``, what every tp rank keeps whole: saved by a norm or as the input
    of a column-wise linear (the residual stream and its norms, as Megatron's tensor
    parallel without sequence parallelism keeps them)."""

    def per_micro_batch(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """(per block, outside the blocks) for a micro-batch: measured in fp32, floating-point
        tensors scaled to ``bytes_per_value``, a block's split over ``tp`` but for what tp
        replicates."""
        f = micro_batch * bytes_per_value / 4
        split = (self.block_float - self.block_replicated) * f + self.block_other * micro_batch
        block = split / max(tp, 1) + self.block_replicated * f
        return block, self.outside_float * f + self.outside_other * micro_batch


def weight_derived(t: Any, depth: int = 6) -> bool:
    """A parameter, or a chain of one-input ops (view, transpose, cast) from one parameter
    to a tensor of its size: ``W.t()``, autocast's or FSDP's bf16 copy of ``W``. An
    embedding's output also has a parameter as its only differentiable input, but not its
    size. A leaf that is not an ``nn.Parameter`` is an activation: a pipeline stage's input,
    received from the stage before and made to require grad, is kept by its first block."""
    from torch import nn

    if t.is_leaf:
        return isinstance(t, nn.Parameter)
    node = t.grad_fn
    for _ in range(depth):
        nexts = [f for f, _ in getattr(node, "next_functions", ()) if f is not None]
        if len(nexts) != 1:
            return False
        node = nexts[0]
        leaf = getattr(node, "variable", None)
        if leaf is not None:
            return isinstance(leaf, nn.Parameter) and leaf.numel() == t.numel()
    return False


def kept_whole_under_tp(model: Any, style_of: Callable[[str], str | None]) -> set[int]:
    """Ids of the modules whose saved tensors every tp rank keeps whole, for ``measure_saved``'s
    ``replicated``: the norms and the column-wise modules (``style_of(module name)`` starts
    with ``colwise``), whose input, the normed residual stream, is replicated; what the other
    modules save is split by heads or by the MLP's width. One rule for every model kind."""
    return {
        id(m)
        for name, m in model.named_modules()
        if "norm" in type(m).__name__.lower() or (style_of(name) or "").startswith("colwise")
    }


def measure_saved(
    model: Any,
    blocks: list[Any],
    inputs: Any,
    forward_loss: Callable[[Any, Any], Any],
    replicated: set[int] | None = None,
) -> SavedBytes:
    """Run ``forward_loss(model, inputs)`` once under the saved-tensor hooks (meta tensors).
    ``replicated``: ids of the blocks' modules whose saved tensors tensor parallel keeps
    whole (:attr:`SavedBytes.block_replicated`, by the innermost module saving them)."""
    import torch

    rec = _SavedRecorder(model, replicated or set())
    hooks = [b.register_forward_pre_hook(rec.enter) for b in blocks]
    hooks += [b.register_forward_hook(rec.leave) for b in blocks]
    for m in (m for b in blocks for m in b.modules()):
        hooks += [m.register_forward_pre_hook(rec.push), m.register_forward_hook(rec.pop)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            forward_loss(model, inputs)
    finally:
        for h in hooks:
            h.remove()
    return rec.saved(max(len(blocks), 1))


class _SavedRecorder:
    """The saved-tensor and module hooks of :func:`measure_saved`: each storage autograd
    saves, once, with whether a block saved it, its kind and size, and whether tensor
    parallel keeps it whole."""

    def __init__(self, model: Any, replicated: set[int]) -> None:
        self.params = {p.untyped_storage()._cdata for p in model.parameters()}
        # storage -> (in a block, floating-point, bytes, kept whole under tp)
        self.seen: dict[int, tuple[bool, bool, int, bool]] = {}
        self.depth = 0
        self.first_input: float | None = None
        self.inner: list[int] = []  # the modules of the blocks being run, innermost last
        self.replicated = replicated

    def pack(self, t: Any) -> Any:
        st = t.untyped_storage()
        if st._cdata not in self.params and st._cdata not in self.seen and not weight_derived(t):
            whole = bool(self.inner) and self.inner[-1] in self.replicated
            self.seen[st._cdata] = (self.depth > 0, t.is_floating_point(), st.nbytes(), whole)
        return t

    def push(self, module: Any, _args: tuple) -> None:
        self.inner.append(id(module))

    def pop(self, _module: Any, _args: tuple, _out: Any) -> None:
        self.inner.pop()

    def enter(self, _module: Any, args: tuple) -> None:
        import torch

        if self.first_input is None and args and isinstance(args[0], torch.Tensor):
            self.first_input = float(args[0].numel() * args[0].element_size())
        self.depth += 1

    def leave(self, _module: Any, _args: tuple, _out: Any) -> None:
        self.depth -= 1

    def total(self, in_block: bool, is_float: bool) -> float:
        return float(sum(n for b, f, n, _ in self.seen.values() if b == in_block and f == is_float))

    def saved(self, per: int) -> SavedBytes:
        whole = sum(n for b, f, n, r in self.seen.values() if b and f and r)
        return SavedBytes(
            block_replicated=whole / per,
            block_float=self.total(True, True) / per,
            block_other=self.total(True, False) / per,
            outside_float=self.total(False, True),
            outside_other=self.total(False, False),
            block_input=self.first_input or 0.0,
        )


LOW_PRECISION = (("saved_autocast", "float32"), ("saved_bf16", "bfloat16"))
"""The bf16 measurements a record keeps beside its fp32 ``saved``: under autocast over fp32
parameters (DDP, ZeRO-1: the residual stream stays fp32, each matmul saves its own bf16
copy of its input) and with bf16 parameters too (FSDP's mixed precision)."""


def measure_low_precision(
    model: Any, measure: Callable[[Any], dict[str, float] | None]
) -> dict[str, dict[str, float]]:
    """``measure(model)`` (one sample's saved bytes, as :func:`measure_saved` gives them)
    under bf16 autocast, once for each of :data:`LOW_PRECISION`'s parameter dtypes.
    Measured rather than scaled, because a model keeps at 4 bytes what it computes in fp32
    (a norm that upcasts, autocast's fp32 ops). Autocast as on this CPU (CUDA's casts these
    ops alike). Changes ``model``'s parameters' dtype: the caller's last use of it. {} when
    a forward fails under autocast."""
    import torch

    out: dict[str, dict[str, float]] = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for key, dtype_name in LOW_PRECISION:
            dtype = getattr(torch, dtype_name)
            for p in model.parameters():  # as FSDP's policy: parameters, not buffers
                p.data = p.data.to(dtype)  # (``Module.to`` cannot swap fake tensors)
            measured = measure(model)
            if measured is None:
                return {}
            out[key] = measured
    return out


def low_precision_bytes(
    record: dict[str, Any], micro_batch: int, tp: int
) -> tuple[float, float] | None:
    """(per block, outside) at bf16 with bf16 parameters, as measured; None when the record
    has no bf16 measurement (the fp32 bytes are then halved)."""
    low = record.get("saved_bf16")
    return SavedBytes(**low).per_micro_batch(micro_batch, 4, tp) if low else None


def autocast_extra_bytes(record: dict[str, Any], micro_batch: int, tp: int) -> tuple[float, float]:
    """What autocast over fp32 parameters saves beyond bf16 parameters, as measured; 0 when
    the record has neither measurement."""
    if not (record.get("saved_autocast") and record.get("saved_bf16")):
        return 0.0, 0.0
    over = SavedBytes(**record["saved_autocast"]).per_micro_batch(micro_batch, 4, tp)
    low = SavedBytes(**record["saved_bf16"]).per_micro_batch(micro_batch, 4, tp)
    return over[0] - low[0], over[1] - low[1]
