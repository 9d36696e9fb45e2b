"""The lists of modules the launcher tells its fork server to import before it forks the
workers: written by :func:`dtrain_cli.launch.worker_server.announce`, read by the server's
preload (:mod:`dtrain_cli.launch.server_preload`).

``<path>.0``, ``<path>.1``...: JSON ``{"modules": [...], "last": bool}``, each written
atomically; the first as soon as the config is composed, the last with the plan. The server
reads them in order, imports each list as it comes and removes it, and stops after the one
marked last. Everything here is a speed-up: an unreadable list ends the wait, a module that
fails to import is left to the worker.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import time

WAIT_S = 600.0


def write_list(path: str, modules: list[str], last: bool) -> None:
    with open(f"{path}.tmp", "w") as f:
        json.dump({"modules": modules, "last": last}, f)
    os.replace(f"{path}.tmp", path)


def import_announced_modules(path: str | None, launcher: int) -> list[str]:
    """The lists ``<path>.0``, ``<path>.1``... in order, until the one marked last.
    Returns the names that imported."""
    imported: list[str] = []
    if not path or not launcher:
        return imported
    for part in itertools.count():
        announced = _wait_for_list(f"{path}.{part}", launcher)
        if announced is None:
            return imported
        for name in announced.get("modules", []):
            with contextlib.suppress(Exception):  # the worker imports it again and reports
                importlib.import_module(name)
                imported.append(name)
        if announced.get("last", True):
            return imported
    return imported


def _wait_for_list(path: str, launcher: int) -> dict | None:
    """The list at ``path`` once it appears; None after ``WAIT_S`` or when unreadable."""
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path):
        if not _alive(launcher):  # the launcher is gone (killed before it could say)
            raise SystemExit(0)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    try:
        with open(path) as f:
            announced = json.load(f)
        os.unlink(path)
    except (OSError, ValueError):
        return None
    return announced if isinstance(announced, dict) else None


def _alive(launcher: int) -> bool:
    """The launcher still runs: it is this server's parent, or (a warm pool's server, a
    child of the pool) a process that still exists."""
    if os.getppid() == launcher:
        return True
    if os.getppid() == _POOL_PARENT:
        try:
            os.kill(launcher, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return False


_POOL_PARENT = -1  # a warm pool's pid, in the servers it forks (:mod:`.pool_server`)


def served_by_pool(pool_pid: int) -> None:
    global _POOL_PARENT
    _POOL_PARENT = pool_pid
