"""Tensor parallelism with DTensor: ``parallelize_module`` over the mesh's tp axis.

Megatron-style: q/k/v and the MLP's first linear are split column-wise (each tp rank
holds n_head/tp heads and 4*n_embd/tp hidden units), the two output projections
row-wise (one all-reduce each, in forward and backward). The token embedding is split
over the vocabulary (row-wise, output all-reduced) and the LM head column-wise with the
logits gathered, so the loss sees full logits. Norms and the position embedding stay
replicated; their gradients are identical on every tp rank because their inputs are.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from dtrain_cli.runtime.model import GPT

BLOCK_PLAN = {
    "attn.q": ColwiseParallel(),
    "attn.k": ColwiseParallel(),
    "attn.v": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "mlp.fc": ColwiseParallel(),
    "mlp.proj": RowwiseParallel(),
}


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh) -> None:
    """Shard ``model`` (a whole GPT or one pipeline stage of it) in place."""
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, BLOCK_PLAN)
    ends = {}
    if model.tok_embeddings is not None:
        ends["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        )
    if model.lm_head is not None:
        ends["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    if ends:
        parallelize_module(model, tp_mesh, ends)
