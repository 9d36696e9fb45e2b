"""Token corpora and the deterministic global sample stream.

Corpora (prepared once, in the launcher, before workers start):
- ``builtin``: Python's own standard-library ``.py`` files (present wherever Python is),
  byte-level tokens (vocab 256), cached as a memory-mapped token file.
- ``text``: a user file or folder, read the same way.
- ``tokens``: pre-tokenized ``.bin`` files (nanoGPT layout: ``train.bin``/``val.bin``).
- ``synthetic``: random tokens from the seed; no I/O.
- ``hf``: local JSONL/Parquet/text files through ``datasets``, any local tokenizer
  (:mod:`.hf_data`), cached as token files like ``text``.
- ``custom``: your map-style dataset from ``data._target_`` (:mod:`.custom_data`); the
  launcher builds it once to check it, each worker builds its own.

Sampling. The training set is cut into windows of ``block_size + 1`` tokens. The
*global sample stream* is, epoch after epoch, a permutation of all windows seeded by
``(seed, epoch)``. Optimizer step ``s`` consumes stream positions
``[s*G, (s+1)*G)`` (G = global batch); micro-step ``k`` of dp rank ``r`` takes the
``micro_batch_size`` positions starting at ``s*G + (k*dp + r)*micro``. So the union
over ranks is exactly the single-process stream, and a resume at any step, with any
dp, continues from ``step * G``. torch's ``DistributedSampler`` interleaves ranks and pads
per epoch, which makes the stream depend on the world size; this does not. numpy only:
the launcher prepares data without importing torch's training stack.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtrain_cli.config.schema import DataConfig

SPLITS = ("train", "val")
_CHECKED: set[str] = set()  # custom datasets this process already built and checked


def cache_root(cfg: DataConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("DTRAIN_CACHE") or Path.home() / ".cache" / "dtrain"
    return Path(root)


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    raise FileNotFoundError(f"data.path={path}: no such file or folder")


def _source_files(cfg: DataConfig) -> list[Path]:
    if cfg.source == "builtin":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        return sorted(stdlib.glob("*.py"))
    return _text_files(Path(cfg.path or ""))


def _write_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    array.tofile(tmp)
    os.replace(tmp, path)


def prepare_corpus(
    cfg: DataConfig, seed: int = 0, vocab_size: int | None = None
) -> dict[str, Path]:
    """Tokenize (once) and return the token file of each split. Safe to call concurrently.
    ``hf``/``custom`` problems (tokenizer larger than ``vocab_size``, a target that builds no
    map-style dataset) raise :class:`~dtrain_cli.config.errors.ConfigError`."""
    if cfg.source == "tokens":
        return _token_files(cfg)
    if cfg.source == "shapes":  # drawn in memory by each worker (runtime/shapes.py)
        return {}
    if cfg.source == "hf":
        from dtrain_cli.runtime.hf_data import prepare_hf

        return prepare_hf(cfg, cache_root(cfg), vocab_size)
    if cfg.source == "custom":  # built here once to check it; each worker builds its own
        from dtrain_cli.runtime.custom_data import build_custom

        key = repr(cfg)
        if key not in _CHECKED:
            build_custom(cfg)
            _CHECKED.add(key)
        return {}
    if cfg.source == "synthetic":
        key = f"synthetic-{cfg.synthetic_tokens}-{seed}-{cfg.val_fraction}"
        files: list[Path] = []
    else:
        files = _source_files(cfg)
        if not files:
            raise FileNotFoundError(f"data.source={cfg.source}: no files found")
        ident = "\n".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
        key = f"{cfg.source}-{hashlib.sha1(f'{ident}{cfg.val_fraction}'.encode()).hexdigest()[:16]}"
    out_dir = cache_root(cfg) / key
    paths = {split: out_dir / f"{split}.bin" for split in SPLITS}
    if all(p.exists() for p in paths.values()):
        return paths
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.source == "synthetic":
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, 256, size=cfg.synthetic_tokens, dtype=np.uint16)
    else:
        raw = b"\n\n".join(p.read_bytes() for p in files)
        tokens = np.frombuffer(raw, dtype=np.uint8).astype(np.uint16)
    n_val = max(2, int(len(tokens) * cfg.val_fraction))
    _write_atomic(paths["train"], tokens[:-n_val])
    _write_atomic(paths["val"], tokens[-n_val:])
    return paths


def _token_files(cfg: DataConfig) -> dict[str, Path]:
    path = Path(cfg.path or "")
    if path.is_dir():
        paths = {split: path / f"{split}.bin" for split in SPLITS}
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            raise FileNotFoundError(f"data.path={path}: missing {', '.join(missing)}")
        return paths
    if not path.is_file():
        raise FileNotFoundError(f"data.path={path}: no such file or folder")
    # One file: split it like text, into the cache.
    tokens = np.memmap(path, dtype=cfg.token_dtype, mode="r")
    key = hashlib.sha1(f"{path.resolve()}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    out_dir = cache_root(cfg) / f"tokens-{key}"
    paths = {split: out_dir / f"{split}.bin" for split in SPLITS}
    if not all(p.exists() for p in paths.values()):
        out_dir.mkdir(parents=True, exist_ok=True)
        n_val = max(2, int(len(tokens) * cfg.val_fraction))
        _write_atomic(paths["train"], np.asarray(tokens[:-n_val]))
        _write_atomic(paths["val"], np.asarray(tokens[-n_val:]))
    return paths


@dataclass
class TokenWindows:
    """Non-overlapping windows of ``block_size + 1`` tokens over a memory-mapped token file."""

    tokens: np.ndarray
    block_size: int

    @classmethod
    def open(cls, path: Path, dtype: str, block_size: int, vocab_size: int | None) -> TokenWindows:
        tokens = np.memmap(path, dtype=dtype, mode="r")
        windows = cls(tokens, block_size)
        if len(windows) < 1:
            raise ValueError(
                f"{path}: {len(tokens)} tokens, fewer than one window of "
                f"block_size+1={block_size + 1}"
            )
        top = int(tokens[: 1 << 20].max())
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


def open_splits(data: DataConfig, model: Any, seed: int) -> dict[str, Any]:
    """train/val datasets: ``len()`` and ``pairs(indices) -> (inputs, targets)`` (built-in
    sources), or map-style items (``data=custom``); :mod:`.loader` batches either."""
    if data.source == "shapes":
        from dtrain_cli.runtime.shapes import ShapeImages

        n_val = max(1, int(data.num_samples * data.val_fraction))
        n_train = data.num_samples - n_val
        args = (model.image_size, model.num_classes, seed)
        return {
            "train": ShapeImages(n_train, *args, offset=0),
            "val": ShapeImages(n_val, *args, offset=n_train),
        }
    if data.source == "custom":
        from dtrain_cli.runtime.custom_data import build_custom

        return build_custom(data)
    paths = prepare_corpus(data, seed, model.vocab_size)
    dtype = data.token_dtype if data.source == "tokens" else "uint16"
    if data.source == "hf":
        from dtrain_cli.runtime.hf_data import cached_dtype

        dtype = cached_dtype(paths)
    return {
        split: TokenWindows.open(path, dtype, model.block_size, model.vocab_size)
        for split, path in paths.items()
    }


if __name__ == "__main__":  # python -m dtrain_cli.runtime.data : prepare the built-in corpus
    print(prepare_corpus(DataConfig()), file=sys.stderr)
