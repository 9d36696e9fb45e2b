"""What a fresh interpreter has that a forked rank must be given back."""

from __future__ import annotations

import random
import sys


def fresh_random_state() -> None:
    """Each rank's own random state, as ``python train.py`` has (``random``, numpy and
    torch seeded from the OS): ranks forked from one server shared it, so every rank drew
    the same numbers (augmentations, dropout, DataLoader workers' seeds), run after run.
    Python's hash seed stays the server's (``PYTHONHASHSEED`` fixes it for every rank)."""
    random.seed()
    if (numpy := sys.modules.get("numpy")) is not None:
        numpy.random.seed()
    if (torch := sys.modules.get("torch")) is not None:
        torch.seed()
