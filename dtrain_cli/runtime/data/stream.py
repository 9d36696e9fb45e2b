"""The deterministic global sample stream over the prepared token files.

Sampling. The training set is cut into windows of ``block_size + 1`` tokens. The
*global sample stream* is, epoch after epoch, a permutation of all windows seeded by
``(seed, epoch)``. Optimizer step ``s`` consumes stream positions
``[s*G, (s+1)*G)`` (G = global batch); micro-step ``k`` of dp rank ``r`` takes the
``micro_batch_size`` positions starting at ``s*G + (k*dp + r)*micro``. So the union
over ranks is exactly the single-process stream, and a resume at any step, with any
dp, continues from ``step * G``. torch's ``DistributedSampler`` interleaves ranks and pads
per epoch, which makes the stream depend on the world size; this does not. The corpora
themselves are prepared by the launcher (:mod:`dtrain_cli.corpus.prepare`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtrain_cli.config.schema import DataConfig
from dtrain_cli.corpus.prepare import open_tokens, prepare_corpus, token_dtype


@dataclass
class TokenWindows:
    """Non-overlapping windows of ``block_size + 1`` tokens over a memory-mapped token file."""

    tokens: np.ndarray
    block_size: int
    identity: str = ""
    """The token file's name (its cache folder's, which is keyed by the sources' sizes and
    times), size and modification time: a checkpoint keeps it, a resume compares."""

    @classmethod
    def open(cls, path: Path, dtype: str, block_size: int, vocab_size: int | None) -> TokenWindows:
        tokens, top = open_tokens(path, dtype)  # the launcher's checks read them alike
        windows = cls(tokens, block_size, file_identity(path))
        if len(windows) < 1:
            raise ValueError(
                f"{path}: {len(tokens)} tokens, fewer than one window of "
                f"block_size+1={block_size + 1}"
            )
        if vocab_size is not None and top >= vocab_size:
            raise ValueError(f"{path}: token id {top} >= model.vocab_size={vocab_size}")
        return windows

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def pairs(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, next-token targets) of the chosen windows."""
        w = self.gather(indices)
        return w[:, :-1], w[:, 1:]

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """(len(indices), block_size + 1) int64 array of the chosen windows."""
        starts = indices.astype(np.int64) * self.block_size
        offsets = np.arange(self.block_size + 1, dtype=np.int64)
        return self.tokens[starts[:, None] + offsets[None, :]].astype(np.int64)


CACHE_FOLDER = re.compile(r"^(text|hf|tokens|builtin|synthetic)-[\w.-]+$")
"""A folder the data cache tokenized into: its name is keyed by the sources' sizes and
times (corpus/prepare.py), which its own files' times (another node's, a cache emptied
and filled again) are not."""


def file_identity(path: Path) -> str:
    """What a checkpoint keeps of the token file it trained on, and a resume compares: a
    cache folder's name (keyed by its sources' sizes and times), or a token file's own
    name and size (data=tokens: a copy to a node's scratch is the same data)."""
    if CACHE_FOLDER.match(path.parent.name):
        return f"{path.parent.name}/{path.name}"
    return f"{path.name}:{path.stat().st_size}"  # a copy per job has its own time


class SampleStream:
    """Window index at each global stream position: epoch ``e`` is a permutation seeded by
    ``(seed, e)``. Identical on every rank; state is just the position."""

    def __init__(self, num_windows: int, seed: int) -> None:
        self.num_windows = num_windows
        self.seed = seed
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = rng.permutation(self.num_windows)
            self._epoch = epoch
        return self._perm

    def indices(self, start: int, count: int) -> np.ndarray:
        first, last = start // self.num_windows, (start + count - 1) // self.num_windows
        if first == last:  # the common case: one slice of one epoch's permutation
            offset = start - first * self.num_windows
            return self._permutation(first)[offset : offset + count].copy()
        out = np.empty(count, dtype=np.int64)
        for i in range(count):  # across an epoch boundary
            pos = start + i
            out[i] = self._permutation(pos // self.num_windows)[pos % self.num_windows]
        return out


@dataclass
class BatchLayout:
    """Where one rank's micro-batches sit in the global stream."""

    micro_batch_size: int
    grad_accum: int
    dp: int
    dp_rank: int
    base_step: int = 0
    """Step at which ``base_samples`` stream positions were already consumed (a resume)."""
    base_samples: int = 0

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.dp

    def step_start(self, step: int) -> int:
        """Stream position of the first sample of optimizer step ``step``."""
        return self.base_samples + (step - self.base_step) * self.global_batch

    def micro_start(self, step: int, micro_step: int) -> int:
        return self.step_start(step) + (micro_step * self.dp + self.dp_rank) * (
            self.micro_batch_size
        )


def open_splits(
    data: DataConfig, model: Any, seed: int, roots: Sequence[str] = ()
) -> dict[str, Any]:
    """train/val datasets: ``len()`` and ``pairs(indices) -> (inputs, targets)`` (built-in
    sources), or map-style items (``data=custom``); :mod:`.loader` batches either."""
    if data.source == "shapes":
        from dtrain_cli.runtime.data.shapes import ShapeImages

        n_val = max(1, int(data.num_samples * data.val_fraction))
        n_train = data.num_samples - n_val
        args = (model.image_size, model.num_classes, seed)
        return {
            "train": ShapeImages(n_train, *args, offset=0),
            "val": ShapeImages(n_val, *args, offset=n_train),
        }
    if data.source == "custom":
        from dtrain_cli.corpus.custom import build_custom

        return build_custom(data, roots)
    paths = prepare_corpus(data, seed, model.vocab_size)
    dtype = token_dtype(data, paths)
    return {
        split: TokenWindows.open(path, dtype, model.block_size, model.vocab_size)
        for split, path in paths.items()
    }
