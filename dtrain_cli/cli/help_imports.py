"""Keep `dtrain --help` from importing what it never prints.

Typer renders help and usage errors with ``typer.rich_utils``, which imports, at module
level, ``rich.markdown`` (markdown-it) and ``rich.emoji`` (its table of emoji codes) for
help written in Markdown, and ``rich.traceback`` (pygments through ``rich.syntax``, and
``rich.pretty``) for pretty tracebacks. dtrain uses none of them: its help is rich markup
(``rich_markup_mode="rich"``) and Typer's pretty exceptions are off. Those imports are
about a third of ``dtrain --help``'s time on 2 cores (bench/RESULTS.md, CLI latency).

:func:`install` puts a finder on ``sys.meta_path`` that acts once, when something first
imports ``typer.rich_utils``: while that module runs, the three are stand-ins whose
``Markdown``, ``Emoji`` and ``Traceback`` import the real module on first use (a call or
an attribute), so nothing changes if they are used after all. The stand-ins leave
``sys.modules`` as soon as ``typer.rich_utils`` is loaded: any other import of them gets
the real module.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TARGET = "typer.rich_utils"
DEFERRED = {"rich.markdown": "Markdown", "rich.traceback": "Traceback", "rich.emoji": "Emoji"}


class _Deferred(type):
    """A class standing in for ``module.name``: calls and attributes go to the real one."""

    def __getattr__(cls, attr: str) -> Any:
        return getattr(cls._real(), attr)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real()(*args, **kwargs)


def _deferred(module: str, name: str) -> type:
    def real() -> Any:
        return getattr(importlib.import_module(module), name)

    return _Deferred(name, (), {"_real": staticmethod(real), "__module__": module})


@contextmanager
def _stand_ins() -> Iterator[None]:
    placed: dict[str, types.ModuleType] = {}
    for module, name in DEFERRED.items():
        if module not in sys.modules:
            stub = types.ModuleType(module, f"stand-in for {module} ({__name__})")
            setattr(stub, name, _deferred(module, name))
            sys.modules[module] = placed[module] = stub
    try:
        yield
    finally:
        for module, stub in placed.items():
            if sys.modules.get(module) is stub:
                del sys.modules[module]


class _Loader:
    """Runs the module's own loader with the stand-ins in place. (Duck-typed: importing
    ``importlib.abc`` would cost ``importlib.resources``, 15 ms.)"""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        with _stand_ins():
            self.inner.exec_module(module)


class _Finder:
    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # once; and the real finders below find the module
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Defer the two imports for the rest of this process (no-op once Typer's renderer is
    loaded, or if called twice)."""
    if TARGET in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
