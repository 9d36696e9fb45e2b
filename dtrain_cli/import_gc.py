"""Big imports with the garbage collector paused, and what they made frozen after.

    with imports_without_collection():
        import torch

A fresh ``import torch`` makes some 150k objects that live as long as the process, and the
collector's oldest generation walks all it has each time enough new ones piled up: five
full passes during that one import here, 0.3 s of CPU, 13% of its time (``farm-bench``,
``python -c 'import torch.distributed.elastic...'`` with and without ``gc.disable()``).
Here the imports run with collection paused; then what exists is frozen
(:func:`gc.freeze`): later full passes skip it, and a process forked from this one does not
copy its pages by walking it. A garbage cycle made during the imports stays, as under
Python's own advice for a process that forks (disable early, freeze before the fork).
Torch-free.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_without_collection() -> Iterator[None]:
    """Collection paused inside; on leaving, everything tracked is frozen and collection is
    as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
