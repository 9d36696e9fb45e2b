"""DTensor checks that do not import ``torch.distributed.tensor``.

Importing DTensor costs about 0.5 s (it pulls in sympy and torch.fx); a data-parallel run
never creates one, so the worker leaves it unimported and the first step comes sooner.
If the module is not loaded, no tensor can be a DTensor: the checks below are exact.
Tensor parallel and FSDP import it themselves when they shard the model.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def is_dtensor(x: Any) -> bool:
    """``isinstance(x, DTensor)`` without importing DTensor when nothing uses it."""
    api = sys.modules.get("torch.distributed.tensor._api")
    cls = getattr(api, "DTensor", None) if api is not None else None
    return cls is not None and isinstance(x, cls)


def local_tensor(x: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; a plain tensor as it is."""
    return x.to_local() if is_dtensor(x) else x  # type: ignore[attr-defined]


def full_tensor(x: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor (a collective over its mesh); a plain tensor as it is."""
    return x.full_tensor() if is_dtensor(x) else x  # type: ignore[attr-defined]
