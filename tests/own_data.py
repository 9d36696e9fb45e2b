"""Small user datasets for the data=custom tests and the data-loading benchmark.

    dtrain launch recipe=gpt_tiny data=custom data._target_=tests.own_data.Pairs ++data.n=96

Items depend only on their index (numpy RNG seeded by it), as dtrain asks of a dataset.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset


class Pairs(Dataset):
    """``n`` (inputs, next-token targets) pairs of ``block_size`` tokens: counting sequences
    with a random start and stride, so a language model can learn them."""

    def __init__(self, n: int = 96, block_size: int = 128, vocab: int = 256, sleep_ms: float = 0):
        self.n, self.block_size, self.vocab, self.sleep_s = n, block_size, vocab, sleep_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if self.sleep_s:
            time.sleep(self.sleep_s)  # a slow decode / augmentation
        rng = np.random.default_rng(i)
        start, stride = rng.integers(self.vocab), rng.integers(1, 4)
        seq = (start + stride * np.arange(self.block_size + 1)) % self.vocab
        t = torch.from_numpy(seq.astype(np.int64))
        return t[:-1], t[1:]


class FolderPairs(Pairs):
    """Pairs from a folder, as a dataset that loads its files takes one (``path``: the
    folder, given as ``data.path``)."""

    def __init__(self, path: str, n: int = 8) -> None:
        super().__init__(n=n)
        self.folder = path


class DictPairs(Pairs):
    """The same samples as dicts: ``{"inputs": ..., "targets": ...}``."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = super().__getitem__(i)
        return {"inputs": x, "targets": y}


def make_pairs(n: int = 96, **kwargs) -> Pairs:
    """A function target (not a class) that builds the dataset."""
    return Pairs(n=n, **kwargs)


class Stream(IterableDataset):
    """Not map-style: refused."""

    def __iter__(self):
        yield from range(3)


class Numbers:
    """Map-style, but items are plain ints: refused (not a pair or a dict)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


class Failing:
    def __init__(self, n: int = 1):
        raise ValueError(f"cannot open shard {n}\nsecond line")


NOT_CALLABLE = 42
