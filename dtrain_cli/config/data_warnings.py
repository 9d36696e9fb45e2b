"""The plan's warnings of the data (a run that would train, but not as its user thinks): a
model's vocabulary far larger than its data's, a validation file trained on, records read
as raw text, a tokenizer without an end-of-text token. Torch-free."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from dtrain_cli.config.hf_data_checks import (
    data_suffix,
    eos_warning,
    saved_splits,
    tokenizer_json_vocab,
    visible_files,
)
from dtrain_cli.config.schema import DataConfig

if TYPE_CHECKING:
    from dtrain_cli.models.spec import ModelSpec

BYTE_VOCAB = 256
VOCAB_FACTOR = 10
"""A model vocabulary this many times the data's is a warning: an embedding and an output
layer the data can never use (GPT-2's 50,257 tokens on byte-level data: 196x)."""


def data_vocab(data: DataConfig) -> tuple[int, str] | None:
    """(tokens the data can hold, what they are) when the plan can know it: byte-level
    sources, a tokenizer.json; None otherwise (token files, your dataset)."""
    if data.source in ("builtin", "text") or (data.source == "hf" and not data.tokenizer):
        return BYTE_VOCAB, "byte-level tokens"
    path = Path(data.tokenizer or "").expanduser() / "tokenizer.json"
    if data.source == "hf" and path.is_file():
        try:
            return tokenizer_json_vocab(path), f"the tokenizer's (data.tokenizer={data.tokenizer})"
        except Exception:  # reported by tokenizer_problems
            return None
    return None


def vocab_warning(data: DataConfig, vocab_size: int | None, key: str) -> str | None:
    """The plan's warning when the model's vocabulary (``key``) is ``VOCAB_FACTOR`` times
    the data's or more."""
    known = data_vocab(data)
    if known is None or not vocab_size or vocab_size < VOCAB_FACTOR * known[0]:
        return None
    n, what = known
    return (
        f"{key}={vocab_size:,}: {vocab_size // n}x the data's {n:,} tokens ({what}); the "
        f"embedding and the output layer are that much larger than the data can use (slower "
        f"steps, a higher starting loss); set {key}={n}, or train on data of that "
        "vocabulary (data=tokens, data.tokenizer)"
    )


VAL_NAMES = ("val", "valid", "validation", "dev", "test", "eval")
VAL_FILE = re.compile(rf"^({'|'.join(VAL_NAMES)})([-_]\d[\w-]*)?$")
"""``dev.jsonl``, ``validation-00000-of-00002.parquet``; not ``test_model.py``."""


def _records_as_text(data: DataConfig) -> str | None:
    """data=text of JSON lines, Parquet or CSV records: their keys, quotes and bytes were
    trained on as text, without a word (a new user's find)."""
    path = Path(data.path or "").expanduser()
    if data.source != "text" or not data.path or not path.exists():
        return None
    files = [path] if path.is_file() else visible_files(path)
    kinds = {data_suffix(f) for f in files}
    records = kinds & {".jsonl", ".json", ".parquet", ".csv"}
    if not files or kinds != records:
        return None
    return (
        f"data.path={data.path}: {' and '.join(sorted(records))} records, read by data=text "
        "as raw bytes (keys, quotes and all); data=hf reads each record's data.text_field"
    )


def _same_file(path: Path, other: str) -> bool:
    try:
        return path.samefile(Path(other).expanduser())
    except OSError:
        return False


def _validation_file_warning(data: DataConfig) -> str | None:
    """A file or folder under ``data.path`` named for validation (``dev.jsonl``, ``val/``):
    every file under ``data.path`` trains, so it was trained on; or a ``data.val_path``
    inside ``data.path``, trained on as well as validated on."""
    path = Path(data.path or "").expanduser()
    if data.val_path is not None and path.is_file() and _same_file(path, data.val_path):
        return (
            f"data.val_path={data.val_path} is data.path: the validation loss is on data it "
            "trains on; give held-out records (or leave data.val_path unset: the last "
            "data.val_fraction of data.path validates)"
        )
    if data.source not in ("text", "hf") or not path.is_dir() or saved_splits(path) is not None:
        return None  # a saved DatasetDict trains on its train split only
    if data.val_path is not None:
        val = Path(data.val_path).expanduser().resolve()
        if val == path.resolve() or path.resolve() in val.parents:
            return (
                f"data.val_path={data.val_path} is inside data.path={data.path}: it is "
                "trained on as well as validated on; move it out of data.path"
            )
        return None
    for file in visible_files(path):
        rel = file.relative_to(path)
        # a text tree's test/ and eval/ folders are code as often as not
        names = VAL_NAMES if data.source == "hf" else VAL_NAMES[:-2]
        folder = next((p for p in rel.parts[:-1] if p.lower() in names), None)
        if folder is None and not VAL_FILE.match(rel.name.split(".")[0].lower()):
            continue
        named = rel.parts[: rel.parts.index(folder) + 1] if folder else rel.parts
        shown = Path(*named)
        return (
            f"data.path={data.path} holds {shown}{'/' if folder else ''}: it is trained on, "
            "as every file there is (validation: the last data.val_fraction of them); "
            f"data.val_path={path / shown} validates on it instead (move it out of data.path)"
        )
    return None


def data_warnings(data: DataConfig, spec: ModelSpec) -> list[str]:
    """The plan's warnings of the data: a model's vocabulary far larger than its data's (none
    when the model's config cannot be made: the plan's problems say why), a tokenizer
    without an end-of-text token to put between records."""
    out = [
        w for w in (eos_warning(data), _validation_file_warning(data), _records_as_text(data)) if w
    ]
    try:
        vocab = spec.vocab_size
    except Exception:
        return out
    if getattr(spec.cfg, "pretrained", None):  # its weights fix it: not a key to set
        return out
    warning = vocab_warning(data, vocab, spec.vocab_key)
    return ([warning] if warning else []) + out
