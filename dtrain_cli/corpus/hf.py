"""``data=hf``: local JSONL / Parquet / CSV / text files (or compressed), or a ``save_to_disk``
folder, tokenized once into the token-file cache.

    dtrain launch data=hf data.path=corpus.jsonl data.tokenizer=/models/my-tok model.vocab_size=8192

The launcher reads the files with the ``datasets`` library (``load_dataset("json" |
"parquet" | "csv" | "text", data_files=...)`` or ``load_from_disk``, no hub), tokenizes the
``data.text_field`` of every record with a local tokenizer folder (``tokenizer.json``
through ``tokenizers``, or any ``AutoTokenizer`` folder) or byte-level tokens, separates
records with the tokenizer's end-of-text token and writes ``train.bin``/``val.bin`` like
the other corpora (keyed by the files' identity, the tokenizer and the split). Workers then
read :class:`~dtrain_cli.runtime.data.stream.TokenWindows`, so every layout sees the same
global sample stream and a resume continues it exactly.
The Hugging Face packages are optional and imported here only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtrain_cli.config.data_checks import val_data
from dtrain_cli.config.hf_data_checks import (
    HF_EXTRA,
    VAL_SPLITS,
    eos_from_config,
    hf_data_files,
    hf_format,
    vocab_problem,
)
from dtrain_cli.config.schema import DataConfig
from dtrain_cli.errors import ConfigError

META = "meta.json"


@dataclass
class TextTokenizer:
    ident: str
    """What the cache key depends on: the tokenizer's files (or ``bytes``)."""
    vocab_size: int
    eos_id: int | None
    encode_batch: Callable[[list[str]], list[list[int]]]
    separator: list[int]
    """Tokens put between two records (the end-of-text token; byte-level: a blank line)."""


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError([f"data.source=hf needs the '{module}' package: {HF_EXTRA}"]) from None


def _folder_ident(path: Path) -> str:
    files = sorted(p for p in path.iterdir() if p.is_file())
    return "\n".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)


def load_tokenizer(folder: str | None) -> TextTokenizer:
    """The tokenizer of ``data.tokenizer``; byte-level (vocab 256) when unset."""
    if not folder:
        return TextTokenizer(
            "bytes", 256, None, lambda texts: [list(t.encode()) for t in texts], [10, 10]
        )
    path = Path(folder).expanduser().resolve()
    ident = f"{path}\n{_folder_ident(path)}"
    if (path / "tokenizer.json").is_file():
        tokenizers = _need("tokenizers")
        tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))

        def encode(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

        eos = eos_from_config(path, tok.token_to_id)
        size = tok.get_vocab_size(with_added_tokens=True)
    else:
        transformers = _need("transformers")
        auto = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)

        def encode(texts: list[str]) -> list[list[int]]:
            return auto(texts, add_special_tokens=False)["input_ids"]

        eos, size = auto.eos_token_id, len(auto)
    return TextTokenizer(ident, size, eos, encode, [] if eos is None else [eos])


def _record_sets(
    data: DataConfig, files: list[Path], fmt: str, cache: Path, key: str = "data.path"
) -> tuple[Any, Any]:
    """:func:`_read_records`, with a file ``datasets`` cannot read (not UTF-8, a JSON line cut
    short, a Parquet file read as JSON) said in one line: its 70-line traceback came after
    ``dtrain plan`` had found nothing wrong (it reads the first record only)."""
    try:
        return _read_records(data, files, fmt, cache)
    except ConfigError:
        raise
    except Exception as exc:  # datasets' DatasetGenerationError, pyarrow's ArrowInvalid ...
        chain: list[BaseException] = [exc]
        while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None:
            chain.append(nxt)
        # the parser's own words: pyarrow's ("JSON parse error: ... in row 1"), the decoder's;
        # not pandas' fallback under it ("Trailing data at position 16")
        named = [c for c in chain if type(c).__name__ in ("ArrowInvalid", "UnicodeDecodeError")]
        cause = named[0] if named else chain[-1]
        why = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        if isinstance(cause, UnicodeDecodeError):
            why += "; not UTF-8 text (data=text reads any bytes)"
        raise ConfigError([f"{key}={data.path}: cannot be read as {fmt} records ({why})"]) from None


def _read_records(data: DataConfig, files: list[Path], fmt: str, cache: Path) -> tuple[Any, Any]:
    """(the training records, the validation records or None: the last ``val_fraction`` of
    the training tokens). A ``save_to_disk`` folder is read with ``load_from_disk``: a
    ``DatasetDict``'s ``train`` split, and its validation split where it has one."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never the hub
    datasets = _need("datasets")
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its failures: one line of ours
    if fmt == "saved":
        ds = datasets.load_from_disk(str(Path(data.path or "").expanduser()))
        if isinstance(ds, datasets.DatasetDict):
            return ds["train"], next((ds[s] for s in VAL_SPLITS if s in ds), None)
        return ds, None
    kwargs = {"sample_by": "document"} if fmt == "text" else {}
    train = datasets.load_dataset(
        fmt,
        data_files=[str(f) for f in files],
        split="train",
        cache_dir=str(cache / "hf_datasets"),
        **kwargs,
    )
    return train, None


TEXT_DTYPES = ("string", "large_string")


def _texts(
    data: DataConfig, ds: Any, fmt: str, where: str, nulls: dict[str, int]
) -> Iterable[list[str]]:
    """Batches of the records' text, in order; a record whose text is null is left out (it
    was an empty record: a separator alone) and counted in ``nulls[where]``."""
    field = "text" if fmt == "text" else data.text_field
    if field not in ds.column_names:
        raise ConfigError(
            [
                f"data.text_field={data.text_field}: not a column of {where} "
                f"(columns: {', '.join(ds.column_names)})"
            ]
        )
    kind = ds.features[field]
    if getattr(kind, "dtype", None) not in TEXT_DTYPES:  # ids, numbers, chat message lists
        texts = [k for k, f in ds.features.items() if getattr(f, "dtype", None) in TEXT_DTYPES]
        raise ConfigError(
            [
                f"data.text_field={field}: a column of {_kind_text(kind)} in {where}, not "
                f"text: every record would train as an empty one; name a text column "
                f"({', '.join(texts) or 'none here'}), or write the text into one first"
            ]
        )
    for batch in ds.select_columns([field]).iter(batch_size=1024):
        texts = batch[field]
        kept = [t for t in texts if t is not None]
        nulls[where] = nulls.get(where, 0) + len(texts) - len(kept)
        if kept:  # a batch of nulls alone: nothing to encode (an AutoTokenizer refuses [])
            yield kept


def _kind_text(kind: Any) -> str:
    dtype = getattr(kind, "dtype", None)
    return dtype if dtype else f"{type(kind).__name__.lower()}s (e.g. chat messages)"


def _tokenize(tok: TextTokenizer, texts: Iterable[list[str]]) -> np.ndarray:
    """The records' tokens, one after another, with the separator between two records."""
    parts: list[np.ndarray] = []
    sep = np.asarray(tok.separator, dtype=np.int64)
    for batch in texts:
        for ids in tok.encode_batch(batch):
            if parts and len(sep):
                parts.append(sep)
            parts.append(np.asarray(ids, dtype=np.int64))
    dtype = token_dtype(tok.vocab_size)
    return np.concatenate(parts).astype(dtype) if parts else np.empty(0, dtype=dtype)


def prepare_hf(
    data: DataConfig, cache: Path, vocab_size: int | None, vocab_key: str = "model.vocab_size"
) -> dict[str, Path]:
    """Tokenize (once) and return the token file of each split."""
    val_cfg = val_data(data)  # data.val_path: its records validate, all of data.path trains
    try:
        files = hf_data_files(data)
        val_files = hf_data_files(val_cfg) if val_cfg is not None else []
    except FileNotFoundError as exc:
        raise ConfigError([str(exc)]) from None
    fmt = hf_format(data, files)
    tok = load_tokenizer(data.tokenizer)
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise ConfigError(
            [vocab_problem(vocab_size, tok.vocab_size, str(data.tokenizer), vocab_key)]
        )
    ident = "\n".join(
        f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in [*files, *val_files]
    )
    ident += f"\n{fmt}:{data.text_field}:{data.val_fraction}:val={len(val_files)}\n{tok.ident}"
    ident += "\nnull texts left out"  # they were empty records: another stream, another key
    out_dir = cache / f"hf-{hashlib.sha1(ident.encode()).hexdigest()[:16]}"
    paths = {split: out_dir / f"{split}.bin" for split in ("train", "val")}
    if (out_dir / META).is_file() and all(p.exists() for p in paths.values()):
        return paths
    train_records, val_records = _record_sets(data, files, fmt, cache)
    val_fmt = fmt
    if val_cfg is not None:
        val_fmt = hf_format(val_cfg, val_files)
        val_records, _ = _record_sets(val_cfg, val_files, val_fmt, cache, "data.val_path")
    nulls: dict[str, int] = {}  # records without text, said once the tokens are written
    tokens = _tokenize(tok, _texts(data, train_records, fmt, str(data.path), nulls))
    if val_records is not None:
        val_where = str((val_cfg or data).path)
        train, val = tokens, _tokenize(tok, _texts(data, val_records, val_fmt, val_where, nulls))
    else:
        n_val = max(2, int(len(tokens) * data.val_fraction))
        if len(tokens) < 2 * n_val:
            raise ConfigError(
                [f"data.path={data.path}: only {len(tokens)} tokens after tokenizing"]
            )
        train, val = tokens[:-n_val], tokens[-n_val:]
    out_dir.mkdir(parents=True, exist_ok=True)
    from dtrain_cli.corpus.cache import write_atomic

    write_atomic(paths["train"], train)
    write_atomic(paths["val"], val)
    meta = {
        "dtype": str(tokens.dtype),
        "vocab_size": tok.vocab_size,
        "tokens": len(train) + len(val),
    }
    for where, n in nulls.items():
        if n:
            print(f"warning: {where}: {n:,} records have no text (null): left out", file=sys.stderr)
    tmp = out_dir / f".{META}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, out_dir / META)  # last: marks the cache entry complete
    return paths


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def cached_dtype(paths: dict[str, Path]) -> str:
    """The dtype :func:`prepare_hf` wrote the token files with."""
    meta = paths["train"].parent / META
    return str(json.loads(meta.read_text())["dtype"])
