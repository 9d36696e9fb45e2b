"""A language model of a user's own, for the ``custom`` benchmark: plain PyTorch, no dtrain.

``dtrain launch recipe=own_lm --config-dir bench/own_model`` trains it as ``model=custom
model._target_=own_lm.OwnLM``; ``bench/plain_ddp.py --custom-model`` builds the same class
under the same seed in a hand-written DDP loop (``bench/custom_workload.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm causal self-attention, then a GELU MLP, each with a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class OwnLM(nn.Module):
    """Token ids [B, T] in, next-token scores [B, T, vocab] out."""

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 128,
        width: int = 128,
        depth: int = 4,
        heads: int = 4,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.pos = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))
