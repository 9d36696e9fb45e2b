"""Where prepared corpora live (``data.cache_dir``, ``$DTRAIN_CACHE``, ``~/.cache/dtrain``)
and how a token file is written there: atomically, so concurrent preparations and a
crash never leave half a file under its final name.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dtrain_cli.config.schema import DataConfig
from dtrain_cli.rundir import env


def cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir or env.cache_root() or Path.home() / ".cache" / "dtrain")


def write_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    array.tofile(tmp)
    os.replace(tmp, path)
