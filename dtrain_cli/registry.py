"""Entries of one seam by name (a strategy, a sync mode): the registry both seams share.

Each entry is a class with a ``name``, in its own module of the seam's package, decorated
with :meth:`Registry.register`; :meth:`Registry.discover` imports every module of the
package once (the entries register themselves), so adding an entry is adding a file.
Lightning Fabric's strategy registry is the pattern. Torch-free, and imports nothing of
dtrain: the plan, the advisor and the CLI ask it for names without loading a runtime.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """``key=<name>`` → the entry class registered under that name."""

    def __init__(
        self,
        *,
        package: str,
        key: str,
        order: Callable[[type[T]], Any],
        unknown: type[ValueError],
    ) -> None:
        self.package, self.key, self.order, self.unknown = package, key, order, unknown
        self._entries: dict[str, type[T]] = {}
        self._discovered = False  # an entry imported directly registers before discovery

    def register(self, cls: type[T]) -> type[T]:
        """Class decorator: the class becomes ``<key>=<cls.name>``."""
        self._entries[cls.name] = cls  # type: ignore[attr-defined]
        return cls

    def discover(self) -> dict[str, type[T]]:
        """Every entry module of the package (all but ``base``), imported once."""
        if not self._discovered:
            package = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(package.__path__):
                if info.name != "base":
                    importlib.import_module(f"{self.package}.{info.name}")
            self._discovered = True
        return self._entries

    def names(self) -> tuple[str, ...]:
        """The registered names in the seam's order (then by name)."""
        entries = self.discover()
        return tuple(sorted(entries, key=lambda n: (self.order(entries[n]), n)))

    def get(self, name: str) -> T:
        """An instance of the entry ``name``; an unknown name is one line naming the choices."""
        entries = self.discover()
        if name not in entries:
            close = difflib.get_close_matches(str(name), self.names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            choices = ", ".join(self.names())
            raise self.unknown(f"{self.key}={name}: not allowed{hint}; choose one of {choices}")
        return entries[name]()
