"""Results kept between commands on disk (kept compositions, help pages): written
atomically, so two commands writing the same entry at once leave one whole file, and the
oldest entries beyond a count pruned. Writing never fails a command: a write that fails is
skipped. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_entry(where: Path, name: str, data: bytes, keep: int) -> None:
    """``where/name`` holds ``data``; of the other entries with its suffix, the oldest go
    beyond ``keep`` in all."""
    tmp = where / f".{name}.{os.getpid()}.tmp"
    try:
        where.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, where / name)
        _prune(where, where / name, keep)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _prune(where: Path, written: Path, keep: int) -> None:
    """Never ``written``, the one just written (file times are coarser than a quick run of
    writes)."""
    others = sorted(
        (p for p in where.glob(f"*{written.suffix}") if p != written),
        key=lambda p: p.stat().st_mtime_ns,
    )
    for old in others[: max(0, len(others) + 1 - keep)]:
        with contextlib.suppress(OSError):
            old.unlink()
