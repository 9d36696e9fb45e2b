"""What the plan measured of a model of your own, kept in the data cache so that planning it
again imports no torch and builds nothing (``dtrain plan`` and ``dtrain launch`` of a config
seen before).

    <cache>/custom-facts/<sha256 of the key>.json   # <cache>: as the HF facts and corpora

A record holds the meta-device build's counts (:class:`~dtrain_cli.models.spec.ModelFacts`),
the bytes one sample's forward and loss save for backward (fp32, and bf16 under autocast:
:mod:`.measure`), and the class names of its
modules (what ``parallel.fsdp_units`` is checked against); the plan's checks run again on
it each time. Its key is everything those depend on: the target and its arguments, the data
source and loss, the pipeline's layer list and ends, the tp plan, the import roots, the
installed torch and the source of dtrain's counting code, and `parallel.fsdp_units` (the
blocks counted when no layer list is named). Your code is not in the key but
in the record: the size and modification time of every loaded module file of the packages
your targets (model, nested targets, loss) come from, installed or not, and of every other module
loaded from the import roots (the standard library, other installed packages and dtrain
aside); a record whose files changed is a miss, as Python's own cached bytecode is. A
measurement that did not complete (the loss did not import, the forward failed on the
meta device and on fake tensors) is not recorded. Reading or writing it never fails a plan.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

from dtrain_cli.models.records import files_hash, key_of

FOLDER = "custom-facts"
FORMAT = 4
"""The record's layout; raise it when its fields change."""
_COUNTING_CODE = (
    Path(__file__).with_name("spec.py"),
    Path(__file__).with_name("measure.py"),
    Path(__file__).with_name("tp_layout.py"),
    Path(__file__).parent.parent / "spec.py",
    Path(__file__).parent.parent / "units.py",
    Path(__file__).parent.parent / "saved_bytes.py",
    Path(__file__).parent.parent / "losses.py",
)


def record_key(options: list[Any]) -> str | None:
    """The key for ``options`` (JSON-able); None when torch's version or dtrain's counting
    code cannot be read (then nothing is recorded)."""
    try:
        torch_version = importlib.metadata.version("torch")
        code = files_hash(_COUNTING_CODE)
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    return key_of([FORMAT, torch_version, code, options])


def source_files(roots: list[str], targets: list[str]) -> list[list[Any]] | None:
    """[path, mtime_ns, size] of the module files the measurement may depend on: every loaded
    module of the packages the ``targets`` (dotted paths: the model, nested targets, the loss)
    belong to, wherever they are installed, and every other loaded module under ``roots``
    but the standard library, installed packages and dtrain itself (torch's version and
    dtrain's counting code are in the key). None when a target's own module has no file
    to watch: such a measurement is not recorded."""
    packages = {t.split(".")[0] for t in targets} - {"torch"}  # torch: its version is keyed
    modules = {t.rpartition(".")[0] for t in targets if t.split(".")[0] in packages}
    here = str(Path(__file__).resolve().parent.parent.parent)  # the dtrain_cli package
    skip = [
        os.path.realpath(p)
        for p in {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        if p
    ]
    under = [os.path.realpath(r) for r in roots]
    out, watched = [], set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        real = os.path.realpath(path)
        if name.split(".")[0] not in packages:
            inside = any(real.startswith(r + os.sep) for r in under)
            if not inside or real.startswith(here + os.sep) or "site-packages" in real:
                continue
            if any(real.startswith(p + os.sep) for p in skip):
                continue
        try:
            st = os.stat(real)
        except OSError:
            continue
        out.append([real, st.st_mtime_ns, st.st_size])
        watched.add(name)
    if not modules <= watched:
        return None
    return sorted(out)


def sources_unchanged(files: Any) -> bool:
    """Whether every file of a record still has its size and modification time."""
    if not isinstance(files, list):
        return False
    try:
        for path, mtime_ns, size in files:
            st = os.stat(path)
            if (st.st_mtime_ns, st.st_size) != (mtime_ns, size):
                return False
    except (OSError, TypeError, ValueError):  # gone, or a record not of this layout
        return False
    return True
