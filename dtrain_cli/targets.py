"""Resolve a user's ``_target_`` (a model, dataset or loss) to the Python object it names.

    dtrain plan data=custom data._target_=my_models.net.Pairs

The import path is the current directory, each ``--config-dir`` folder and ``PYTHONPATH``
(:func:`import_roots`); the launcher resolves every target once before any worker starts,
so a typo, a module that fails to import or a target into the standard library (``os.system``,
``builtins.eval``) is a one-line :class:`TargetError` naming the config key, not a traceback
on every rank. Generic: what kind of object a key needs is checked by its caller.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# Modules a target may never resolve into: the standard library and the interpreter's builtins.
_REFUSED_MODULES = frozenset(sys.stdlib_module_names) | {"builtins", "__main__"}


class TargetError(ValueError):
    """A ``_target_`` that cannot be used; ``str(e)`` is one line naming the config key."""


# Keys of a target's node that Hydra's instantiate reads itself (not the class's arguments)
HYDRA_KEYS = ("_target_", "_args_", "_convert_", "_recursive_", "_partial_")


def argument_key_problems(kwargs: dict, prefix: str) -> list[str]:
    """A key of a model's or dataset's arguments spelled like one of Hydra's own
    (``model._targt_``): one line each, with the key it resembles. The arguments
    themselves are plain names: ``model.width=16``, or ``model.kwargs.width=16``."""
    import difflib

    out = []
    for key in kwargs:
        if isinstance(key, str) and key.startswith("_") and key not in HYDRA_KEYS:
            close = difflib.get_close_matches(key, HYDRA_KEYS, n=1, cutoff=0.6)
            hint = f"did you mean {prefix}.{close[0]}?" if close else "not an argument name"
            out.append(
                f"{prefix}.{key}: {hint} (arguments of the class are plain names: "
                f"{prefix}.NAME=VALUE, or {prefix}.kwargs.NAME=VALUE)"
            )
    return out


def import_roots(config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """cwd, each --config-dir folder, then PYTHONPATH entries: absolute, deduplicated, in order."""
    candidates: list[str | Path] = [Path.cwd(), *config_dirs]
    candidates += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    roots: list[str] = []
    for entry in candidates:
        path = str(Path(entry).expanduser().resolve())
        if path not in roots:
            roots.append(path)
    return roots


def _top_module(obj: object) -> str | None:
    """The top-level package the object was defined in (``os`` for ``os.system``)."""
    if isinstance(obj, functools.partial):
        return _top_module(obj.func)
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return name.split(".")[0] if isinstance(name, str) and name else None


def _searched(roots: Sequence[str]) -> str:
    return ", ".join(roots) or "sys.path"


def _import_prefix(parts: list[str], shown: str, roots: Sequence[str]) -> tuple[object, int]:
    """Import the longest importable module prefix of ``parts``; return it and its length."""
    searched = _searched(roots)
    for n in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:n])
        try:
            return importlib.import_module(module), n
        except ModuleNotFoundError as e:
            # The prefix itself (or its package) is missing: try a shorter one
            # (``pkg.Class.method``). A module that imports something missing is the user's error.
            missing = e.name is not None and (module == e.name or module.startswith(e.name + "."))
            if missing and n > 1:
                continue
            if missing:
                raise TargetError(f"{shown}: no module '{module}' (searched: {searched})") from None
            raise TargetError(
                f"{shown}: module '{module}' does not import: {_one_line(e)} (searched: {searched})"
            ) from None
        except Exception as e:  # any failure in the user's module is reported
            raise TargetError(
                f"{shown}: module '{module}' does not import: {_one_line(e)} (searched: {searched})"
            ) from None
    raise TargetError(f"{shown}: no module '{parts[0]}' (searched: {searched})")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def resolve_target(dotted: str, *, key: str, roots: Sequence[str] = ()) -> object:
    """Import `pkg.module.Attr` with `roots` first on sys.path and return the object.

    Refuses (:class:`TargetError`) a dotted path that is not ``module.attr``, a module that
    does not import, a missing attribute, and any target that resolves into the standard
    library or builtins.
    """
    shown = f"{key}={dotted}"
    parts = dotted.split(".") if isinstance(dotted, str) else []
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise TargetError(f"{shown}: expected a dotted path 'package.module.Name'")
    if parts[0] in _REFUSED_MODULES:
        raise TargetError(
            f"{shown}: targets in the standard library or builtins are refused; "
            "name a class or function in your own module"
        )
    for root in reversed(list(roots)):
        if root in sys.path:
            sys.path.remove(root)
        sys.path.insert(0, root)
    importlib.invalidate_caches()
    obj, n = _import_prefix(parts, shown, roots)
    for i in range(n, len(parts)):
        try:
            obj = getattr(obj, parts[i])
        except AttributeError:
            owner = ".".join(parts[:i])
            if isinstance(obj, types.ModuleType) and i < len(parts) - 1:
                # ``pkg.missing_module.Name``: the module is what is missing.
                name = f"{owner}.{parts[i]}"
                raise TargetError(
                    f"{shown}: no module '{name}' (searched: {_searched(roots)})"
                ) from None
            raise TargetError(f"{shown}: '{owner}' has no attribute '{parts[i]}'") from None
    if _top_module(obj) in _REFUSED_MODULES:
        raise TargetError(
            f"{shown}: resolves into the standard library or builtins "
            f"('{_top_module(obj)}'), which is refused; name your own class or function"
        )
    return obj


def nested_targets(value: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """(``<key>._target_``, dotted path) of every ``_target_`` inside keyword arguments
    (``model.kwargs``, ``data.kwargs``: Hydra's ``instantiate`` builds them too)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "_target_":
                yield f"{prefix}._target_", str(v)
            else:
                yield from nested_targets(v, f"{prefix}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from nested_targets(v, f"{prefix}.{i}")
