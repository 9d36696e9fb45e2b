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

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from dtrain_cli.config.hf_data_checks import (
    hf_problems,
    visible_files,
)
from dtrain_cli.config.schema import DataConfig, DtrainConfig
from dtrain_cli.targets import TargetError, import_roots, nested_targets, resolve_target


def data_problems(cfg: DtrainConfig, config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """One line per problem with the data of ``cfg``; empty when it can be loaded."""
    data = cfg.data
    problems = unread_data_problems(cfg)
    val = val_data(data)
    if data.source == "text":
        paths = _path_problems(data.path, "data.path")
        if val is not None:
            paths += _path_problems(val.path, "data.val_path")
        problems += paths or _split_problems(data, cfg.model)
    elif data.source == "tokens":
        paths = _token_path_problems(data)
        if val is not None:
            paths += _token_val_problems(data)
        problems += paths or _split_problems(data, cfg.model)
    elif data.source == "hf":
        problems += hf_problems(data, getattr(cfg.model, "vocab_size", None), vocab_key(cfg))
        if val is not None:  # read as data.path is, with data.path's tokenizer
            val.tokenizer = None
            problems += [p.replace("data.path=", "data.val_path=") for p in hf_problems(val, None)]
    elif data.source == "custom":
        # the run's own roots first (a resume from another folder finds its modules there)
        roots = list(dict.fromkeys([*cfg.run.import_roots, *import_roots(config_dirs)]))
        problems += target_problems(data, roots)
    return problems


READS_PATH = ("text", "tokens", "hf")


def unread_data_problems(cfg: DtrainConfig) -> list[str]:
    """What the data source would never read, known without opening a file: also checked
    for a job whose data is on the cluster's nodes (``dtrain sbatch``, ``dtrain k8s``),
    whose pods trained on the built-in corpus with ``data.path`` given."""
    data, problems = cfg.data, []
    if data.source != "custom":
        if data.kwargs:
            keys = ", ".join(f"data.{k}" for k in data.kwargs)
            problems.append(f"{keys}: only data=custom takes extra keys (arguments of _target_)")
        if data._target_:
            problems.append(
                f"data._target_={data._target_}: only read by data=custom (data.source="
                f"{data.source}); add data=custom"
            )
    return problems + _unread_problems(data)


def val_data(data: DataConfig) -> DataConfig | None:
    """``data`` reading ``data.val_path`` (its validation files) instead; None when unset."""
    if data.val_path is None:
        return None
    return dataclasses.replace(data, path=data.val_path, val_path=None)


PASSED_TO_CUSTOM = ("path", "tokenizer")
"""Keys of dtrain's own data sources that ``data=custom`` passes to its dataset (``data.path``
is the natural name of a dataset's folder argument; it was refused, and the dataset then
said it takes ``data.path``)."""


def custom_arguments(data: DataConfig) -> dict:
    """The keyword arguments of a ``data=custom`` dataset: its own keys, and those of
    :data:`PASSED_TO_CUSTOM` that are set."""
    given = {k: getattr(data, k) for k in PASSED_TO_CUSTOM if getattr(data, k) is not None}
    return {**given, **data.kwargs}


def _unread_problems(data: DataConfig) -> list[str]:
    """A path or tokenizer the chosen source would never read: without this, ``data.path=
    my.txt`` alone trained on the built-in corpus and said nothing."""
    problems: list[str] = []
    if data.source == "custom":  # path, tokenizer: its dataset's arguments (custom_arguments)
        if data.val_path is not None:
            problems.append(
                f"data.val_path={data.val_path}: data=custom validates on data.val_target (a "
                "dataset built with the same arguments) or the last data.val_fraction of "
                "its items; set data.val_target, or give your dataset its own argument "
                f"(data.kwargs.val_path={data.val_path})"
            )
        return problems
    if data.val_path is not None and data.source not in READS_PATH:
        problems.append(
            f"data.val_path={data.val_path}: only read by data=text, data=tokens or data=hf "
            f"(data.source={data.source} ignores it)"
        )
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


def _path_problems(given: str | None, key: str) -> list[str]:
    path = Path(given or "").expanduser()
    if path.is_file():
        return []
    if path.is_dir():
        if visible_files(path):
            return []
        return [
            f"{key}={given}: no files in it (hidden ones, and those in hidden folders, "
            "are not read); give a text file or a folder of them"
        ]
    return [f"{key}={given}: no such file or folder"]


def _token_val_problems(data: DataConfig) -> list[str]:
    """data.val_path with token files: one file (of ``data.token_dtype`` ids, or .npy) beside
    one file; a folder of train.bin and val.bin has its own."""
    if Path(data.path or "").expanduser().is_dir():
        return [
            f"data.val_path={data.val_path}: data.path={data.path} is a folder with its own "
            "val.bin; unset data.val_path, or give data.path one token file"
        ]
    if not Path(data.val_path or "").expanduser().is_file():
        return [f"data.val_path={data.val_path}: no such file (one token file, as data.path)"]
    return []


def short_split(data: DataConfig, split: str, tokens: int, block_size: int) -> str:
    """A split too short for one window of ``block_size + 1`` tokens, and what lengthens it
    (``data.val_path`` set: its own file is the val split, no fraction is taken)."""
    where = f"data.path={data.path}" if data.path else f"data={data.source}"
    if data.val_path is not None:
        where = f"data.val_path={data.val_path}" if split == "val" else where
        more = "a longer validation file" if split == "val" else "a larger corpus"
    else:
        fraction = "smaller" if split == "train" else "larger"
        more = f"a larger corpus, a {fraction} data.val_fraction (now {data.val_fraction})"
    return (
        f"{where}: its {split} split holds {tokens} tokens, fewer than one window of "
        f"model.block_size+1={block_size + 1}; {more} or a smaller model.block_size"
    )


def _split_problems(data: DataConfig, model: object) -> list[str]:
    """What the launch's token windows would refuse, from the files' sizes where they give
    the token count (byte-level text: one token a byte, a blank line between files; one raw
    token file): a split shorter than one window."""
    block_size = getattr(model, "block_size", None)
    n = _size_in_tokens(data, data.path)
    if not isinstance(block_size, int) or n is None:
        return []
    val = _size_in_tokens(data, data.val_path) if data.val_path else None
    if data.val_path and val is None:
        return []
    if val is None:
        val = max(2, int(n * data.val_fraction))
        n -= val
    return [
        short_split(data, split, count, block_size)
        for split, count in (("train", n), ("val", val))
        if count < block_size + 1
    ]


def _size_in_tokens(data: DataConfig, given: str | None) -> int | None:
    """Tokens a byte-level text file or folder (a blank line between files), or one raw
    token file, holds; None where the files' sizes do not say (a token folder, an .npy)."""
    path = Path(given or "").expanduser()
    if data.source == "text":
        files = [path] if path.is_file() else visible_files(path)
        return sum(f.stat().st_size for f in files) + 2 * (len(files) - 1)
    if path.is_file() and path.suffix != ".npy":
        return path.stat().st_size // {"uint8": 1, "uint16": 2}.get(data.token_dtype, 4)
    return None


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


def vocab_key(cfg: DtrainConfig) -> str:
    """Where the model's vocabulary is set (``model.config.vocab_size`` for model=hf), or
    ``model.pretrained=DIR`` when a pretrained folder's weights fix it."""
    from dtrain_cli.models import spec_class

    if pretrained := getattr(cfg.model, "pretrained", None):
        return f"model.pretrained={pretrained}"
    try:
        return spec_class(cfg.model.kind).vocab_key
    except Exception:  # an unknown kind: said by the model's own checks
        return "model.vocab_size"


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
        p
        for key, dotted, obj in builders
        for p in _builder_problems(key, dotted, obj, custom_arguments(data))
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
