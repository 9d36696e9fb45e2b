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


def import_announced_modules(path: str | None, launcher: int) -> None:
    """The lists ``<path>.0``, ``<path>.1``... in order, until the one marked last."""
    if not path or not launcher:
        return
    for part in itertools.count():
        announced = _wait_for_list(f"{path}.{part}", launcher)
        if announced is None:
            return
        for name in announced.get("modules", []):
            with contextlib.suppress(Exception):  # the worker imports it again and reports
                importlib.import_module(name)
        if announced.get("last", True):
            return


def _wait_for_list(path: str, launcher: int) -> dict | None:
    """The list at ``path`` once it appears; None after ``WAIT_S`` or when unreadable."""
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path):
        if os.getppid() != launcher:  # the launcher is gone (killed before it could say)
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
