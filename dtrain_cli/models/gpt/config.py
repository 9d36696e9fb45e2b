"""The built-in GPT's config: a nanoGPT-style decoder-only transformer. Torch-free.

dtrain plan recipe=gpt_small model.n_layer=12 model.n_embd=768
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class GPTConfig:
    """A nanoGPT-style decoder-only transformer."""

    kind: str = "gpt"
    name: str = "gpt"
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    vocab_size: int = 256
    dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = False
    """Tie the LM head to the token embedding (off: keeps pipeline stages independent)."""
    attention: str = "sdpa"
    """``sdpa``: torch's fused kernel (flash attention on GPUs), which keeps no s x s
    scores; ``math``: the attention written out (scores, mask, softmax, dropout), as
    Megatron-LM and GPT-2 ran before flash attention: each block keeps its softmax for
    backward, b x heads x s x s, and moves it through memory (``models.gpt.spec``)."""


ATTENTIONS = ("sdpa", "math")

POSITIVE = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
LIMITS = {
    "n_layer": 4096,
    "n_head": 4096,
    "n_embd": 2**20,
    "block_size": 2**24,
    "vocab_size": 2**24,
}
"""Beyond any model trained today; the plan's counts stay cheap below them."""
