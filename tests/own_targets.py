"""Targets for the tests of tests/unit/test_own_model.py: bad inputs, and a token model."""

import torch
from torch import nn


def not_a_module(**kwargs: object) -> dict:
    return dict(kwargs)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """A language model of someone's own: token ids in, next-token scores out."""

    def __init__(
        self, vocab_size: int = 256, block_size: int = 32, width: int = 32, depth: int = 2
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.pos = nn.Parameter(torch.zeros(block_size, width))
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class WideOnly(TinyLM):
    """Builds only in a world of at most 64 ranks (a layout that fails at scale, in start-up)."""

    def __init__(self, **kwargs: int) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 64:
            raise ValueError(f"width 32 does not divide over {dist.get_world_size()} ranks")
        super().__init__(**kwargs)


class AttnBlock(nn.Module):
    """Pre-norm attention through ``F.scaled_dot_product_attention``, then an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class AttnLM(TinyLM):
    """TinyLM with attention blocks: what most models of one's own look like."""

    def __init__(
        self, vocab_size: int = 256, block_size: int = 32, width: int = 32, heads: int = 2,
        depth: int = 2,
    ) -> None:  # fmt: skip
        super().__init__(vocab_size=vocab_size, block_size=block_size, width=width, depth=depth)
        self.blocks = nn.ModuleList(AttnBlock(width, heads) for _ in range(depth))


class ReadsAValue(AttnLM):
    """Reads a tensor's value while it is built: it cannot be built on fake tensors."""

    def __init__(self, **kwargs: int) -> None:
        self.scale = float(torch.ones(1, device="cpu").sum())
        super().__init__(**kwargs)


class Pair(nn.Module):
    """Two attention blocks run one after the other."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.inner = nn.ModuleList(AttnBlock(width, heads) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.inner:
            x = block(x)
        return x


class PairedLM(AttnLM):
    """Blocks grouped in pairs: the largest nn.ModuleList holds the pairs, so FSDP and
    activation checkpointing wrap pairs unless ``parallel.fsdp_units=[AttnBlock]``."""

    def __init__(self, depth: int = 4, heads: int = 2, width: int = 32, **kwargs: int) -> None:
        super().__init__(depth=depth, heads=heads, width=width, **kwargs)
        self.blocks = nn.ModuleList(Pair(width, heads) for _ in range(depth // 2))


class BufferPosLM(TinyLM):
    """Its position table a buffer (sinusoids are), which only its own forward adds."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        del self.pos
        self.register_buffer("pos", torch.randn(32, 32))


class TiedLM(TinyLM):
    """The head tied to the token embedding."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.head = nn.Linear(32, self.embed.num_embeddings, bias=False)
        self.head.weight = self.embed.weight


class FrozenLM(TinyLM):
    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.requires_grad_(False)


def per_position_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Not reduced: one loss per position."""
    return nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten(), reduction="none")


def tied_sequential(vocab_size: int = 256, block_size: int = 32) -> nn.Sequential:
    """An nn.Sequential whose last layer is tied to its first."""
    embed, head = nn.Embedding(vocab_size, 32), nn.Linear(32, vocab_size, bias=False)
    head.weight = embed.weight
    return nn.Sequential(embed, nn.Linear(32, 32), nn.Linear(32, 32), head)


class BreaksOnWidth(TinyLM):
    """A forward that fails at some widths (a user's rotary code at an odd head size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        half = torch.ones(h.shape[-1] // 2 + 1)
        return h * half  # the last dims differ: never broadcasts


class SharedBlockLM(TinyLM):
    """One block run three times (ALBERT's sharing) and an alias of the head: modules under
    two names."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        shared = Block(32)
        self.blocks = nn.ModuleList([shared, shared, shared])
        self.out = self.head


class FactorizedLM(TinyLM):
    """ALBERT's factorized embedding: 16 features per token, projected to the width."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.embed = nn.Embedding(256, 16)
        self.embed_proj = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_proj(self.embed(x)) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(h)
