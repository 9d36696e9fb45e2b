"""Plan-time checks of ``data=hf`` (and the file listing ``data=text`` shares): formats by
extension, ``save_to_disk`` folders, a JSONL file's first record, tokenizer folders.

    dtrain plan data=hf data.path=corpus.jsonl.gz data.tokenizer=/models/my-tok

Torch-free and ``datasets``-free: files are listed with ``pathlib``, a saved dataset's
splits and columns read from its JSON files, a tokenizer's vocabulary with ``tokenizers``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from dtrain_cli.config.schema import DataConfig
from dtrain_cli.hub import download_hint

HF_EXTRA = "pip install 'dtrain[hf]'"
EXTENSIONS = {
    "json": (".jsonl", ".json"),
    "parquet": (".parquet",),
    "csv": (".csv",),
    "text": (".txt",),
}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
"""What ``datasets`` decompresses as it reads: ``corpus.jsonl.gz`` is JSON lines."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


VAL_SPLITS = ("validation", "valid", "val", "test")
"""A saved ``DatasetDict``'s split that validates (the first of these it has: ``test`` is
what ``Dataset.train_test_split`` names it, and was left unread); without one, the last
``data.val_fraction`` of its ``train`` split."""


def saved_splits(path: Path) -> list[str] | None:
    """The splits of a ``save_to_disk`` folder (``[""]``: one ``Dataset``); None: not one.
    Read with ``datasets.load_from_disk``: its ``state.json`` and ``dataset_info.json`` are
    not records."""
    if (path / "dataset_dict.json").is_file():
        try:
            return [str(s) for s in json.loads((path / "dataset_dict.json").read_text())["splits"]]
        except (ValueError, KeyError, TypeError):
            return []
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
        return [""]
    return None


def _saved_problems(data: DataConfig, path: Path, splits: list[str]) -> list[str]:
    """A saved ``DatasetDict`` without a ``train`` split; a text field its records lack."""
    if splits != [""] and "train" not in splits:
        return [
            f"data.path={data.path}: a saved DatasetDict without a train split (splits: "
            f"{', '.join(splits) or 'none'}); save the training records as 'train'"
        ]
    info = path / ("train" if splits != [""] else "") / "dataset_info.json"
    try:
        columns = list(json.loads(info.read_text()).get("features") or {})
    except (OSError, ValueError, AttributeError):
        return []  # load_from_disk says what is wrong with it
    if columns and data.text_field not in columns:
        return [
            f"data.text_field={data.text_field}: not a column of {data.path} (columns: "
            f"{', '.join(columns)})"
        ]
    return []


def hf_format(data: DataConfig, files: Sequence[Path]) -> str:
    """json | parquet | csv | text: ``data.format``, or from the files' extension; mixed, or
    unknown (an extension none of them has: it was read as text, a .csv's commas and
    all)."""
    if saved_splits(Path(data.path or "").expanduser()) is not None:
        return "saved"
    if data.format != "auto":
        return data.format
    kinds = {_kind(p) for p in files}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def data_suffix(path: Path) -> str:
    """The extension that says the format: ``.jsonl`` of ``corpus.jsonl.gz``."""
    return Path(path.stem).suffix if path.suffix in COMPRESSED else path.suffix


def _kind(path: Path) -> str:
    return next((k for k, exts in EXTENSIONS.items() if data_suffix(path) in exts), "unknown")


def visible_files(folder: Path) -> list[Path]:
    """The files under ``folder``, sorted, but none hidden or inside a hidden folder: a
    repository's ``.git`` objects (compressed blobs) were most of a text corpus."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def hf_data_files(data: DataConfig) -> list[Path]:
    """The files of ``data.path`` (a file, or a folder's files of the format), sorted."""
    path = Path(data.path or "").expanduser()
    if path.is_file():
        return [path.resolve()]
    if not path.is_dir():
        hint = download_hint("data.path", str(data.path or ""), dataset=True)
        raise FileNotFoundError(f"data.path={data.path}: no such file or folder{hint}")
    if saved_splits(path) is not None:  # what the cache key depends on
        return [p.resolve() for p in visible_files(path)]
    exts = (
        EXTENSIONS[data.format]
        if data.format != "auto"
        else tuple(e for v in EXTENSIONS.values() for e in v)
    )
    files = [p.resolve() for p in visible_files(path) if data_suffix(p) in exts]
    if not files:
        raise FileNotFoundError(f"data.path={data.path}: no {'/'.join(exts)} files in it")
    return files


def hf_problems(
    data: DataConfig, vocab_size: int | None, vocab_key: str = "model.vocab_size"
) -> list[str]:
    problems: list[str] = []
    for module in ("datasets", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            return [f"data.source=hf needs the '{module}' package: {HF_EXTRA}"]
    try:
        if not data.path:  # said by "data.path is required" (Path("") was this folder)
            raise FileNotFoundError
        files = hf_data_files(data)
    except FileNotFoundError as exc:
        problems += [str(exc)] if data.path else []
    else:
        fmt = hf_format(data, files)
        if fmt == "mixed":
            problems.append(
                f"data.path={data.path}: files of several formats; set data.format="
                f"{'|'.join(EXTENSIONS)} or keep one kind of file"
            )
        elif fmt == "unknown":
            exts = "/".join(e for v in EXTENSIONS.values() for e in v)
            problems.append(
                f"data.path={data.path}: not a {exts} file (or one compressed: "
                f"{'/'.join(COMPRESSED)}); set data.format={'|'.join(EXTENSIONS)} to say how "
                "to read it"
            )
        elif fmt == "json":
            problems += _first_record_problems(data, files[0])
        elif fmt == "saved":
            path = Path(data.path or "").expanduser()
            problems += _saved_problems(data, path, saved_splits(path) or [])
    if data.tokenizer:
        problems += tokenizer_problems(data.tokenizer, vocab_size, vocab_key)
    return problems


def _first_record_problems(data: DataConfig, path: Path) -> list[str]:
    """A JSONL file's first record must hold ``data.text_field`` (cheap; no datasets import)."""
    if path.suffix != ".jsonl":
        return []
    with path.open("rb") as f:
        line = next((raw for raw in f if raw.strip()), b"")
    if not line:
        return [f"data.path={path}: empty (no record in it)"]
    try:
        record = json.loads(line) if line else {}
    except ValueError:
        return [f"data.path={path}: line 1 is not JSON (a .jsonl file holds one object a line)"]
    if isinstance(record, dict) and data.text_field not in record:
        columns = ", ".join(record) or "none"
        return [f"data.text_field={data.text_field}: not a field of {path} (fields: {columns})"]
    return []


def tokenizer_problems(
    folder: str, vocab_size: int | None, vocab_key: str = "model.vocab_size"
) -> list[str]:
    path = Path(folder).expanduser()
    if not path.is_dir():
        hint = download_hint("data.tokenizer", folder)
        return [
            f"data.tokenizer={folder}: no such folder (a tokenizer folder, e.g. with a "
            f"tokenizer.json; unset it for byte-level tokens){hint}"
        ]
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return [f"data.tokenizer={folder}: no {' or '.join(TOKENIZER_FILES)} in it"]
    if not (path / "tokenizer.json").is_file():
        if importlib.util.find_spec("transformers") is None:
            return [f"data.tokenizer={folder}: needs the 'transformers' package: {HF_EXTRA}"]
        return []  # an AutoTokenizer-only folder: its vocabulary is checked at launch
    try:
        size = tokenizer_json_vocab(path / "tokenizer.json")
    except Exception as exc:  # the tokenizers library raises its own types
        reason = " ".join(str(exc).split())
        return [f"data.tokenizer={folder}: tokenizer.json does not load ({reason})"]
    if vocab_size is not None and size > vocab_size:
        return [vocab_problem(vocab_size, size, folder, vocab_key)]
    return []


def tokenizer_json_vocab(path: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)


def vocab_problem(vocab_size: int, needed: int, folder: str, key: str = "model.vocab_size") -> str:
    """``key``: where the model's vocabulary is set (``model.config.vocab_size`` for
    ``model=hf``), or ``model.pretrained=DIR``: its weights fix it."""
    if key.startswith("model.pretrained="):
        return (
            f"data.tokenizer={folder}: {needed} tokens, more than {key}'s vocabulary of "
            f"{vocab_size}; train it with its own tokenizer (data.tokenizer="
            f"{key.partition('=')[2]}, if the folder has one)"
        )
    return (
        f"{key}={vocab_size}: below the tokenizer's {needed} tokens "
        f"(data.tokenizer={folder}); set {key}={needed} or more"
    )


def eos_from_config(path: Path, token_to_id: Callable[[str], int | None]) -> int | None:
    """The id of the tokenizer's end-of-text token: ``tokenizer_config.json``'s
    ``eos_token``, else the first of :data:`EOS_NAMES` it has; None when it has none."""
    names: list[str] = []
    config = path / "tokenizer_config.json"
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            names.append(eos)
    for name in [*names, *EOS_NAMES]:
        tid = token_to_id(name)
        if tid is not None:
            return tid
    return None


def eos_warning(data: DataConfig) -> str | None:
    """Records are joined with the tokenizer's end-of-text token; a ``tokenizer.json``
    without one joins them with nothing between (one record runs into the next)."""
    path = Path(data.tokenizer or "").expanduser()
    if data.source != "hf" or not (path / "tokenizer.json").is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # reported by tokenizer_problems
        return None
    if eos_from_config(path, tok.token_to_id) is not None:
        return None
    return (
        f"data.tokenizer={data.tokenizer}: no end-of-text token (tokenizer_config.json's "
        f"eos_token, or one of {', '.join(EOS_NAMES)}): records are joined with nothing "
        "between them, each running into the next; add one to the tokenizer"
    )
