"""A nanoGPT-style decoder: token + position embeddings, pre-norm blocks, LM head.

Built so parallelisms can take it apart without rewriting it: blocks live in a
``ModuleDict`` keyed by layer index (a pipeline stage deletes the ones it does not own
and the remaining names stay those of the full model, so checkpoints line up), and a
stage without embeddings or head simply has them set to ``None``. The loss is computed
outside the model (``train.loss``, cross entropy by default) so a pipeline schedule can
apply it on the last stage. Its config is :mod:`.config`, its counts and checks :mod:`.spec`.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from dtrain_cli.models.gpt.config import GPTConfig

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from dtrain_cli.models.spec import StageSpan as StagePlan


class Dropout(nn.Dropout):
    """``nn.Dropout`` through ``torch.native_dropout``, the kernel CUDA's ``F.dropout`` runs:
    backward keeps a one-byte mask on every device (``F.dropout`` on CPU keeps one of the
    input's dtype), so the plan's activation estimate (:meth:`GPTSpec.activation_bytes`)
    holds here as on GPUs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p if self.training else 0.0)


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.native_dropout(x, p, True)[0] if p > 0.0 else x


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = Dropout(cfg.dropout)
        self.fused = cfg.attention == "sdpa"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 for the head count: under tensor parallelism each rank holds n_head / tp heads.
        q, k, v = (
            lin(x).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v)
        )
        p = self.dropout if self.training else 0.0
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        else:
            y = math_attention(q, k, v, p)
        y = y.transpose(1, 2).reshape(b, t, -1)
        return self.resid_dropout(self.proj(y))


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """Causal attention written out (``model.attention=math``), as Megatron-LM computed it
    before flash attention: the scale folded into q, the (b, heads, s, s) scores masked in
    place and softmaxed in their own dtype (fp32 inside the kernel, like Megatron's fused
    scale-mask-softmax; outside autocast, which would make it fp32 on CUDA but not on
    CPU), dropout, the product with v. Backward keeps the softmax (and dropout's mask)."""
    t = q.shape[-2]
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    # the autocast of the step: CUDA's on GPUs, the CPU's here and for a meta shape pass
    with torch.autocast("cuda" if q.is_cuda else "cpu", enabled=False):
        weights = scores.masked_fill_(future, float("-inf")).softmax(-1)
    return dropout(weights, p) @ v


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.dropout = Dropout(cfg.dropout)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2: residual projections scaled by depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, V); a pipeline stage maps activations instead."""
        if self.tok_embeddings is not None and self.pos_embeddings is not None:
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            h = self.dropout(self.tok_embeddings(tokens) + self.pos_embeddings(pos))
        else:
            h = tokens
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h


def split_stage(model: GPT, stage: StagePlan) -> GPT:
    """A copy of ``model`` holding only the layers (and ends) of one pipeline stage."""
    part = copy.deepcopy(model)
    lo, hi = stage.layers
    for name in list(part.layers.keys()):
        if not lo <= int(name) < hi:
            del part.layers[name]
    if not stage.embeddings:
        part.tok_embeddings = None
        part.pos_embeddings = None
    if not stage.head:
        part.norm = None
        part.lm_head = None
    return part


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh) -> None:
    """Megatron-style, with DTensor's ``parallelize_module`` over the mesh's tp axis: q/k/v
    and the MLP's first linear split column-wise (each tp rank holds n_head/tp heads and
    4*n_embd/tp hidden units), the two output projections row-wise: two all-reduces of the
    (b, s, d) activations per block in forward and two in backward. The attention's input
    becomes one replicated DTensor before q, k and v (``PrepareModuleInput``, as torchtitan
    does), so their three input gradients are summed and all-reduced once (three separate
    column-wise inputs all-reduced one each: 6 per block, not 4). The token embedding is
    split over the vocabulary (row-wise, output all-reduced) and the LM head column-wise
    with the logits gathered, so the loss sees full logits. Norms and the position embedding
    stay replicated; their gradients are identical on every tp rank because their inputs
    are. Works on a whole GPT or one stage."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    block_plan = {
        "attn": PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)
        ),
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(),
        "mlp.fc": ColwiseParallel(),
        "mlp.proj": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)
    ends = {}
    if model.tok_embeddings is not None:
        ends["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        )
    if model.lm_head is not None:
        ends["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    if ends:
        parallelize_module(model, tp_mesh, ends)
