"""The two rooms of the test suite.

- ``tests/unit``: nothing that starts a process (config, plan, overrides, golden files,
  estimators, registries, pure functions, the CLI in-process). ``make test-fast``.
- ``tests/launch``: everything that starts one (launches, ``python -m dtrain_cli``
  subprocesses, bash with stand-ins, SLURM, the k8s replay). Marked ``multiproc``, so
  ``-m "not multiproc"`` selects the unit room too.

``ProcessGuard`` holds the unit room to that: while it is on, starting a process (a
subprocess, ``os.fork``/``posix_spawn``/``system``, a multiprocessing ``Process``) fails the
test with a message saying where it belongs. tests/unit/conftest.py puts it around the setup
and the call of every unit test.
"""

from __future__ import annotations

import _posixsubprocess
import functools
import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
UNIT, LAUNCH = TESTS / "unit", TESTS / "launch"

# Every way a Python test starts a process: subprocess through its own reference to
# _posixsubprocess.fork_exec (or os.posix_spawn), multiprocessing's spawn and forkserver
# through _posixsubprocess.fork_exec, its fork through os.fork.
_TARGETS = (
    (subprocess, "_fork_exec"),
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (multiprocessing.process.BaseProcess, "start"),
)


def _describe(name: str, args: tuple) -> str:
    if name.endswith("fork_exec") and args and isinstance(args[0], (list, tuple)):
        argv = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in args[0]]
        return " ".join(argv)[:200]
    if name in ("system", "posix_spawn", "posix_spawnp") and args:
        return str(args[0])[:200]
    return ""


class ProcessGuard:
    """While entered, every process start is refused (``pytest.fail``: a BaseException, so
    an ``except Exception`` in the code under test does not hide it) and recorded;
    :meth:`check` fails for a recorded one too."""

    active: list[ProcessGuard] = []

    def __init__(self, where: str) -> None:
        self.where = where
        self.started: list[str] = []
        self._saved: list[tuple[object, str, object]] = []

    def _refuse(self, name: str, original: object):
        # wraps: the stand-in keeps the original's module and name, so code that asks where
        # a function comes from (the _target_ guard: os.system is the standard library's)
        # sees the same answer under the guard
        @functools.wraps(original)
        def refuse(*args, **kwargs):
            what = f"{name}({_describe(name, args)})"
            self.started.append(what)
            pytest.fail(self.message(what), pytrace=False)

        return refuse

    def message(self, what: str) -> str:
        return (
            f"{self.where} started a process: {what}. tests/unit starts no process; a test "
            "that needs one belongs in tests/launch (see tests/rooms.py)"
        )

    def __enter__(self) -> ProcessGuard:
        for owner, name in _TARGETS:
            if hasattr(owner, name):
                original = getattr(owner, name)
                self._saved.append((owner, name, original))
                setattr(owner, name, self._refuse(name, original))
        ProcessGuard.active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        ProcessGuard.active.remove(self)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def check(self) -> None:
        if self.started:
            pytest.fail(self.message(", ".join(self.started)), pytrace=False)


def room(path: Path) -> str | None:
    """``unit``, ``launch``, or None for a file outside the rooms."""
    path = Path(path).resolve()
    for name, folder in (("unit", UNIT), ("launch", LAUNCH)):
        if folder in path.parents:
            return name
    return None
