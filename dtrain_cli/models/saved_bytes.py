"""What autograd keeps for backward in one forward of one sample, measured on the meta device.

    dtrain plan model=custom model._target_=my_models.lm.TinyLM model.block_size=64   # activations

A model of your own has no formula for its activations: the plan runs its forward (and the
loss) once on the meta device, with one sample of the token windows it will train on, and
counts every tensor autograd saves (``torch.autograd.graph.saved_tensors_hooks``), each
storage once, parameters left out, split between the repeated blocks and the rest. No
memory, no compute; imports torch (the custom kind's plan does already).
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

    def per_micro_batch(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """(per block, outside the blocks) for a micro-batch: measured in fp32, floating-point
        tensors scaled to ``bytes_per_value``, a block's split over ``tp``."""
        f = micro_batch * bytes_per_value / 4
        block = (self.block_float * f + self.block_other * micro_batch) / max(tp, 1)
        return block, self.outside_float * f + self.outside_other * micro_batch


def measure_saved(
    model: Any, blocks: list[Any], inputs: Any, forward_loss: Callable[[Any, Any], Any]
) -> SavedBytes:
    """Run ``forward_loss(model, inputs)`` once under the saved-tensor hooks (meta tensors)."""
    import torch

    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, tuple[bool, bool, int]] = {}  # storage -> (in a block, float, bytes)
    depth = [0]
    first_input: list[float] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st._cdata not in params and st._cdata not in seen:
            seen[st._cdata] = (depth[0] > 0, t.is_floating_point(), st.nbytes())
        return t

    def enter(_module: Any, args: tuple) -> None:
        if not first_input and args and isinstance(args[0], torch.Tensor):
            first_input.append(float(args[0].numel() * args[0].element_size()))
        depth[0] += 1

    def leave(_module: Any, _args: tuple, _out: Any) -> None:
        depth[0] -= 1

    hooks = [b.register_forward_pre_hook(enter) for b in blocks]
    hooks += [b.register_forward_hook(leave) for b in blocks]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            forward_loss(model, inputs)
    finally:
        for h in hooks:
            h.remove()

    def total(in_block: bool, is_float: bool) -> float:
        return float(sum(n for b, f, n in seen.values() if b == in_block and f == is_float))

    per = max(len(blocks), 1)
    return SavedBytes(
        block_float=total(True, True) / per,
        block_other=total(True, False) / per,
        outside_float=total(False, True),
        outside_other=total(False, False),
        block_input=first_input[0] if first_input else 0.0,
    )
