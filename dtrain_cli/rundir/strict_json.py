"""JSON that any parser reads: a value not measured (NaN, infinity) is written as null.
Python's ``json`` writes ``NaN``, which ``jq``, JavaScript and most other readers reject.
Used for the run directory's summary and each checkpoint's ``meta.json``. Torch-free."""

from __future__ import annotations

import json
import math
from typing import Any


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinity as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite_json` of ``value`` (never ``NaN``)."""
    return json.dumps(finite_json(value), allow_nan=False, **kwargs)
