"""Plan-time checks of the data a config names: paths, tokenizer folders, dataset targets.

    dtrain plan data=text data.path=/nope/corpus.txt        # exit 2, one line, nothing written
    dtrain plan data=custom data._target_=my_data.Pairs

Run by every command that composes a config, before a run dir exists. Torch-free: paths are
checked with ``pathlib``, a JSONL file's first record with ``json``, a tokenizer's vocabulary
with ``tokenizers`` when installed; a ``data._target_`` is imported (that is the user's module)
and must be a class or a callable whose signature takes the other ``data.*`` keys (and not
an ``IterableDataset`` class). Whether the built object is a map-style dataset is checked
when the launcher builds it (:mod:`dtrain_cli.corpus.custom`), before workers start.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dtrain_cli.config.schema import DataConfig, DtrainConfig
from dtrain_cli.hub import download_hint
from dtrain_cli.targets import TargetError, import_roots, nested_targets, resolve_target

if TYPE_CHECKING:
    from dtrain_cli.models.spec import ModelSpec

HF_EXTRA = "pip install 'dtrain[hf]'"
EXTENSIONS = {"json": (".jsonl", ".json"), "parquet": (".parquet",), "text": (".txt",)}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def data_problems(cfg: DtrainConfig, config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """One line per problem with the data of ``cfg``; empty when it can be loaded."""
    data = cfg.data
    problems: list[str] = []
    if data.source != "custom":
        if data.kwargs:
            keys = ", ".join(f"data.{k}" for k in data.kwargs)
            problems.append(f"{keys}: only data=custom takes extra keys (arguments of _target_)")
        if data._target_:
            problems.append(
                f"data._target_={data._target_}: only read by data=custom (data.source="
                f"{data.source}); add data=custom"
            )
    problems += _unread_problems(data)
    if data.source == "text":
        problems += _path_problems(data)
    elif data.source == "tokens":
        problems += _token_path_problems(data)
    elif data.source == "hf":
        problems += hf_problems(data, getattr(cfg.model, "vocab_size", None))
    elif data.source == "custom":
        problems += target_problems(data, import_roots(config_dirs))
    return problems


READS_PATH = ("text", "tokens", "hf")


def _unread_problems(data: DataConfig) -> list[str]:
    """A path or tokenizer the chosen source would never read: without this, ``data.path=
    my.txt`` alone trained on the built-in corpus and said nothing."""
    problems = []
    if data.path is not None and data.source not in READS_PATH:
        problems.append(
            f"data.path={data.path}: only read by data=text, data=tokens or data=hf "
            f"(data.source={data.source} ignores it); add data=text for a text file or folder"
        )
    if data.tokenizer is not None and data.source != "hf":
        problems.append(
            f"data.tokenizer={data.tokenizer}: only read by data=hf (data.source="
            f"{data.source} ignores it); add data=hf"
        )
    return problems


def _path_problems(data: DataConfig) -> list[str]:
    path = Path(data.path or "").expanduser()
    if path.is_file():
        return []
    if path.is_dir():
        if any(p.is_file() for p in path.rglob("*")):
            return []
        return [f"data.path={data.path}: an empty folder; give a text file or a folder of them"]
    return [f"data.path={data.path}: no such file or folder"]


def _token_path_problems(data: DataConfig) -> list[str]:
    path = Path(data.path or "").expanduser()
    if path.is_file():
        return []
    if path.is_dir():
        missing = [s for s in ("train.bin", "val.bin") if not (path / s).is_file()]
        if not missing:
            return []
        return [
            f"data.path={data.path}: a folder without {' and '.join(missing)}; give a folder "
            "with train.bin and val.bin, or one .bin token file"
        ]
    return [f"data.path={data.path}: no such file or folder"]


# -- data=hf -------------------------------------------------------------------------------
def hf_format(data: DataConfig, files: Sequence[Path]) -> str:
    """json | parquet | text: ``data.format``, or from the files' extension."""
    if data.format != "auto":
        return data.format
    kinds = {_kind(p) for p in files}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _kind(path: Path) -> str:
    return next((k for k, exts in EXTENSIONS.items() if path.suffix in exts), "text")


def hf_data_files(data: DataConfig) -> list[Path]:
    """The files of ``data.path`` (a file, or a folder's files of the format), sorted."""
    path = Path(data.path or "").expanduser()
    if path.is_file():
        return [path.resolve()]
    if not path.is_dir():
        hint = download_hint("data.path", str(data.path or ""), dataset=True)
        raise FileNotFoundError(f"data.path={data.path}: no such file or folder{hint}")
    exts = (
        EXTENSIONS[data.format]
        if data.format != "auto"
        else tuple(e for v in EXTENSIONS.values() for e in v)
    )
    files = sorted(p.resolve() for p in path.rglob("*") if p.is_file() and p.suffix in exts)
    if not files:
        raise FileNotFoundError(f"data.path={data.path}: no {'/'.join(exts)} files in it")
    return files


def hf_problems(data: DataConfig, vocab_size: int | None) -> list[str]:
    problems: list[str] = []
    for module in ("datasets", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            return [f"data.source=hf needs the '{module}' package: {HF_EXTRA}"]
    try:
        files = hf_data_files(data)
    except FileNotFoundError as exc:
        problems.append(str(exc))
    else:
        fmt = hf_format(data, files)
        if fmt == "mixed":
            problems.append(
                f"data.path={data.path}: files of several formats; set data.format="
                f"{'|'.join(EXTENSIONS)} or keep one kind of file"
            )
        elif fmt == "json":
            problems += _first_record_problems(data, files[0])
    if data.tokenizer:
        problems += tokenizer_problems(data.tokenizer, vocab_size)
    return problems


def _first_record_problems(data: DataConfig, path: Path) -> list[str]:
    """A JSONL file's first record must hold ``data.text_field`` (cheap; no datasets import)."""
    if path.suffix != ".jsonl":
        return []
    with path.open("rb") as f:
        line = next((raw for raw in f if raw.strip()), b"")
    try:
        record = json.loads(line) if line else {}
    except ValueError:
        return [f"data.path={path}: line 1 is not JSON (a .jsonl file holds one object a line)"]
    if isinstance(record, dict) and data.text_field not in record:
        columns = ", ".join(record) or "none"
        return [f"data.text_field={data.text_field}: not a field of {path} (fields: {columns})"]
    return []


def tokenizer_problems(folder: str, vocab_size: int | None) -> list[str]:
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
        return [vocab_problem(vocab_size, size, folder)]
    return []


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


def model_vocab_warnings(data: DataConfig, spec: ModelSpec) -> list[str]:
    """The plan's warning of a model's vocabulary far larger than its data's (none when the
    model's config cannot be made: the plan's problems say why)."""
    try:
        vocab = spec.vocab_size
    except Exception:
        return []
    warning = vocab_warning(data, vocab, spec.vocab_key)
    return [warning] if warning else []


def tokenizer_json_vocab(path: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)


def vocab_problem(vocab_size: int, needed: int, folder: str) -> str:
    return (
        f"model.vocab_size={vocab_size}: below the tokenizer's {needed} tokens "
        f"(data.tokenizer={folder}); set model.vocab_size={needed} or more"
    )


# -- data=custom ----------------------------------------------------------------------------
def target_problems(data: DataConfig, roots: Sequence[str]) -> list[str]:
    """Every target of a custom dataset imports, is not the standard library, and can be called."""
    from dtrain_cli.targets import argument_key_problems

    if typos := argument_key_problems(data.kwargs, "data"):
        return typos
    wanted = [("data._target_", data._target_)]
    if data.val_target:
        wanted.append(("data.val_target", data.val_target))
    wanted += list(nested_targets(data.kwargs, "data"))
    problems, builders = [], []
    for key, dotted in wanted:
        if not dotted:
            problems.append(f"{key} is required for data=custom (e.g. my_data.Pairs)")
            continue
        try:
            obj = resolve_target(str(dotted), key=key, roots=roots)
        except TargetError as exc:
            problems.append(str(exc))
            continue
        if not callable(obj):
            problems.append(
                f"{key}={dotted}: is a {type(obj).__name__}, not a class or function "
                "that builds a dataset"
            )
        elif key in ("data._target_", "data.val_target"):
            builders.append((key, str(dotted), obj))
    if problems:  # a nested target that does not resolve is the one thing said
        return problems
    return [
        p for key, dotted, obj in builders for p in _builder_problems(key, dotted, obj, data.kwargs)
    ]


def _builder_problems(key: str, dotted: str, obj: object, kwargs: dict) -> list[str]:
    """What the launcher's build would refuse, told without building (which may load the
    data): an ``IterableDataset`` class, or ``data.*`` keys its signature does not take."""
    if isinstance(obj, type) and any(
        c.__name__ == "IterableDataset" and c.__module__.startswith("torch.utils.data")
        for c in obj.__mro__
    ):
        return [
            f"{key}={dotted}: an IterableDataset, not a map-style dataset (__len__ and "
            "__getitem__); dtrain indexes samples so every layout sees the same ones"
        ]
    import inspect

    try:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin or C callable: its build says
        return []
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        takes = ", ".join(f"data.{n}" for n, p in signature.parameters.items() if p.kind in named)
        return [
            f"{key}={dotted}: {getattr(obj, '__name__', dotted)}() {exc}"
            + (f" (it takes {takes})" if takes else " (it takes no arguments)")
        ]
    return []
