"""What a result kept between commands depends on, by file stats (path, size, mtime): dtrain's
own source files, and any other files. A kept composition (:mod:`dtrain_cli.config.compose_cache`)
and the warm worker pool (:mod:`dtrain_cli.launch.warm_pool`) are keyed by them, so an
edit of dtrain's code is never served from before it. Torch-free; an unreadable file is
left out.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path

CODE_ROOT = Path(__file__).resolve().parent  # dtrain_cli/


def stats(paths: Iterable[Path]) -> list[tuple[str, int, int]]:
    out = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p), st.st_size, st.st_mtime_ns))
    return out


def code_files() -> list[Path]:
    """Every ``.py`` file of dtrain_cli, in a fixed order."""
    found = []
    for root, dirs, files in os.walk(CODE_ROOT):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(root, f) for f in sorted(files) if f.endswith(".py")]
    return found


def package_files(names: Iterable[str]) -> list[Path]:
    """The ``__init__.py`` of each installed package named (a reinstall changes its stats)."""
    found = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append(Path(spec.origin))
    return found
