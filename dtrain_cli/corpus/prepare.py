"""Token corpora, prepared once by the launcher before any worker starts (numpy only).

    python -m dtrain_cli.corpus.prepare     # the built-in corpus into the cache

- ``builtin``: Python's own standard-library ``.py`` files (present wherever Python is),
  byte-level tokens (vocab 256), cached as a memory-mapped token file.
- ``text``: a user file or folder, read the same way.
- ``tokens``: pre-tokenized ``.bin`` files (nanoGPT layout: ``train.bin``/``val.bin``).
- ``synthetic``: random tokens from the seed; no I/O.
- ``hf``: local JSONL/Parquet/text files through ``datasets``, any local tokenizer
  (:mod:`.hf`), cached as token files like ``text``.
- ``custom``: your map-style dataset from ``data._target_`` (:mod:`.custom`); the
  launcher builds it once to check it, each worker builds its own.

Workers read the token files through :mod:`dtrain_cli.runtime.data.stream`. Torch-free:
the launcher prepares data without importing torch's training stack.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dtrain_cli.config.data_checks import short_split
from dtrain_cli.config.hf_data_checks import visible_files
from dtrain_cli.config.schema import DataConfig
from dtrain_cli.corpus.cache import cache_root, write_atomic
from dtrain_cli.errors import ConfigError

SPLITS = ("train", "val")
_CHECKED: set[str] = set()  # custom datasets this process already built and checked


def _text_files(given: str | None, key: str = "data.path") -> list[Path]:
    path = Path(given or "").expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        return visible_files(path)
    raise FileNotFoundError(f"{key}={given}: no such file or folder")


def _source_files(cfg: DataConfig) -> list[Path]:
    if cfg.source == "builtin":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        return sorted(stdlib.glob("*.py"))
    return _text_files(cfg.path)


def prepare_corpus(
    cfg: DataConfig,
    seed: int = 0,
    vocab_size: int | None = None,
    roots: Sequence[str] = (),
    vocab_key: str = "model.vocab_size",
) -> dict[str, Path]:
    """Tokenize (once) and return the token file of each split. Safe to call concurrently.
    ``hf``/``custom`` problems (tokenizer larger than ``vocab_size``, set at ``vocab_key``; a
    target that builds no map-style dataset) raise :class:`~dtrain_cli.errors.ConfigError`."""
    if cfg.source == "tokens":
        return _token_files(cfg)
    if cfg.source == "shapes":  # drawn in memory by each worker (runtime/shapes.py)
        return {}
    if cfg.source == "hf":
        from dtrain_cli.corpus.hf import prepare_hf

        return prepare_hf(cfg, cache_root(cfg), vocab_size, vocab_key)
    if cfg.source == "custom":  # built here once to check it; each worker builds its own
        from dtrain_cli.corpus.custom import build_custom

        key = repr(cfg)
        if key not in _CHECKED:
            build_custom(cfg, roots)
            _CHECKED.add(key)
        return {}
    if cfg.source == "synthetic":
        key = f"synthetic-{cfg.synthetic_tokens}-{seed}-{cfg.val_fraction}"
        files: list[Path] = []
    else:
        files = _source_files(cfg)
        if not files:
            raise FileNotFoundError(f"data.source={cfg.source}: no files found")
        val_files = _text_files(cfg.val_path, "data.val_path") if cfg.val_path else []
        ident = "\n".join(  # absolute: the launcher's data.path=a.txt is a worker's /abs/a.txt
            f"{os.path.abspath(p)}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
            for p in [*files, *val_files]
        )
        ident += f"{cfg.val_fraction}" + (f"\nval:{len(val_files)}" if val_files else "")
        key = f"{cfg.source}-{hashlib.sha1(ident.encode()).hexdigest()[:16]}"
    out_dir = cache_root(cfg) / key
    paths = {split: out_dir / f"{split}.bin" for split in SPLITS}
    if all(p.exists() for p in paths.values()):
        return paths
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.source == "synthetic":
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, 256, size=cfg.synthetic_tokens, dtype=np.uint16)
    else:
        tokens = _byte_tokens(files)
        if val_files:  # data.val_path: all of data.path trains
            write_atomic(paths["train"], tokens)
            write_atomic(paths["val"], _byte_tokens(val_files))
            return paths
    n_val = max(2, int(len(tokens) * cfg.val_fraction))
    write_atomic(paths["train"], tokens[:-n_val])
    write_atomic(paths["val"], tokens[-n_val:])
    return paths


def _byte_tokens(files: list[Path]) -> np.ndarray:
    """Byte-level tokens of the files, a blank line between two."""
    raw = b"\n\n".join(p.read_bytes() for p in files)
    return np.frombuffer(raw, dtype=np.uint8).astype(np.uint16)


def _token_files(cfg: DataConfig) -> dict[str, Path]:
    path = Path(cfg.path or "").expanduser()
    if path.is_dir():
        paths = {split: path / f"{split}.bin" for split in SPLITS}
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            raise FileNotFoundError(f"data.path={path}: missing {', '.join(missing)}")
        return paths
    if not path.is_file():
        raise FileNotFoundError(f"data.path={path}: no such file or folder")
    # One file: split it like text (or data.val_path validates), into the cache.
    tokens = _one_token_file(path, cfg.token_dtype)
    ident = f"{path.resolve()}:{path.stat().st_mtime_ns}:{cfg.val_fraction}:{cfg.token_dtype}"
    val_path = Path(cfg.val_path).expanduser() if cfg.val_path else None
    if val_path is not None:
        ident += f"\nval:{val_path.resolve()}:{val_path.stat().st_mtime_ns}"
    key = hashlib.sha1(ident.encode()).hexdigest()[:16]
    out_dir = cache_root(cfg) / f"tokens-{key}"
    paths = {split: out_dir / f"{split}.bin" for split in SPLITS}
    if not all(p.exists() for p in paths.values()):
        out_dir.mkdir(parents=True, exist_ok=True)
        if val_path is not None:
            write_atomic(paths["train"], np.asarray(tokens))
            write_atomic(paths["val"], np.asarray(_one_token_file(val_path, cfg.token_dtype)))
            return paths
        n_val = max(2, int(len(tokens) * cfg.val_fraction))
        write_atomic(paths["train"], np.asarray(tokens[:-n_val]))
        write_atomic(paths["val"], np.asarray(tokens[-n_val:]))
    return paths


def _one_token_file(path: Path, dtype: str) -> np.ndarray:
    """A raw ``.bin`` of ``dtype`` ids, or a ``.npy`` array (``np.save``: its header read by
    numpy, not taken for tokens) whose ids fit ``dtype``."""
    if path.suffix != ".npy":
        return np.memmap(path, dtype=dtype, mode="r")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise ConfigError([f"data.path={path}: not a numpy array file ({exc})"]) from None
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ConfigError(
            [f"data.path={path}: a {arr.ndim}-D {arr.dtype} array; token files hold one 1-D "
             "array of integer token ids"]
        )  # fmt: skip
    if arr.dtype == np.dtype(dtype):
        return arr
    low, top = (int(arr.min()), int(arr.max())) if len(arr) else (0, 0)
    if low < 0:
        raise ConfigError([f"data.path={path}: a negative token id ({low})"])
    if top > np.iinfo(dtype).max:
        fits = next(d for d in ("uint16", "uint32") if top <= np.iinfo(d).max)
        raise ConfigError(
            [f"data.path={path}: ids up to {top} do not fit data.token_dtype={dtype}; set "
             f"data.token_dtype={fits}"]
        )  # fmt: skip
    return np.asarray(arr, dtype=dtype)


def token_dtype(data: DataConfig, paths: dict[str, Path]) -> str:
    """The dtype the split files were written with: the user's (``data=tokens``), the HF
    cache's own record, else uint16 (byte-level and synthetic tokens)."""
    if data.source == "hf":
        from dtrain_cli.corpus.hf import cached_dtype

        return cached_dtype(paths)
    return data.token_dtype if data.source == "tokens" else "uint16"


def open_tokens(path: Path, dtype: str) -> tuple[np.ndarray, int]:
    """A split's tokens, memory-mapped (an empty file too), and the largest id among the
    first million (-1 when there is none): what the launcher and each worker check."""
    tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0)
    return tokens, int(tokens[: 1 << 20].max()) if len(tokens) else -1


def window_problems(
    data: DataConfig, paths: dict[str, Path], block_size: int | None, vocab_size: int | None
) -> list[str]:
    """What each worker's token windows would refuse, said before any starts: a split too
    short for one window of ``block_size + 1`` tokens, a token id past the vocabulary."""
    if block_size is None or not paths:
        return []
    dtype = token_dtype(data, paths)
    where, problems = f"data.path={data.path}" if data.path else f"data={data.source}", []
    for split, path in paths.items():
        tokens, top = open_tokens(path, dtype)
        if len(tokens) < block_size + 1:
            problems.append(short_split(data, split, len(tokens), block_size))
        elif vocab_size is not None and top >= vocab_size:
            problems.append(
                f"{where}: token id {top} in {path.name} >= model.vocab_size={vocab_size}; set "
                f"model.vocab_size above {top} (or data.token_dtype if the ids read wrong)"
            )
    return problems


EPOCHS_WARNED = 10
"""Passes over the training windows from which the launch says the corpus is small."""


def epochs_warning(
    data: DataConfig, paths: dict[str, Path], block_size: int | None, samples: int
) -> str | None:
    """A run that passes over its training windows :data:`EPOCHS_WARNED` times or more: a
    1.4 KB corpus trained 50 times over said nothing (a new user's find)."""
    if block_size is None or "train" not in paths:
        return None
    tokens, _ = open_tokens(paths["train"], token_dtype(data, paths))
    windows = (len(tokens) - 1) // block_size
    if windows <= 0 or samples < EPOCHS_WARNED * windows:
        return None
    where = f"data.path={data.path}" if data.path else f"data={data.source}"
    return (
        f"{samples:,} training samples (train.steps x the global batch) are "
        f"{samples / windows:.0f} passes over {where}'s {windows:,} windows of {block_size} "
        "tokens: a small corpus the model will learn by heart; more data, or fewer train.steps"
    )


if __name__ == "__main__":  # prepare the built-in corpus
    print(prepare_corpus(DataConfig()), file=sys.stderr)
