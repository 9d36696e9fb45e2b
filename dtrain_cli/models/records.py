"""Records the plan keeps in the data cache about a model it had to build to count (a
Hugging Face model's facts, :mod:`.hf.facts_cache`; a model of your own's,
:mod:`.custom.record`), one JSON file per key in a folder per kind:

    <cache>/<folder>/<key>.json   # <cache>: data.cache_dir, $DTRAIN_CACHE, ~/.cache/dtrain

Reading or writing never fails a run: an unreadable record or folder is a miss, a write
that fails is skipped.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from dtrain_cli.rundir import env


def key_of(parts: list[Any]) -> str:
    """A record's key: the sha256 of its parts as JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@functools.cache
def files_hash(paths: tuple[Path, ...]) -> str:
    """The sha256 of the files' bytes (dtrain's counting code, which a key names). OSError
    when one cannot be read."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()


def cache_root(run: Any) -> Path:
    """The data cache (:func:`dtrain_cli.corpus.cache.cache_root`'s rule): the run's
    ``data.cache_dir``, ``$DTRAIN_CACHE`` or ``~/.cache/dtrain``."""
    data = getattr(run, "data", None)
    own = getattr(data, "cache_dir", None)
    return Path(own or env.cache_root() or Path.home() / ".cache" / "dtrain")


def load(root: Path, key: str, folder: str) -> dict[str, Any] | None:
    try:
        record = json.loads((root / folder / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("key") == key else None


def store(root: Path, key: str, record: dict[str, Any], folder: str) -> None:
    """Write the record atomically (concurrent launches of one config write the same bytes)."""
    where = root / folder
    tmp = where / f".{key}.{os.getpid()}.tmp"
    try:
        where.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({**record, "key": key}, sort_keys=True))
        os.replace(tmp, where / f"{key}.json")
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
