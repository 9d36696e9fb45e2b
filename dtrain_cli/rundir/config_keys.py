"""A run's config as dotted keys (``{"parallel.dp": 2, ...}``): what a resume, a node that
joins a run and ``dtrain compare`` compare between two configs. Torch-free, nothing of dtrain.
"""

from __future__ import annotations


def flat_keys(d: object, prefix: str = "") -> dict[str, object]:
    """A nested config as ``{"parallel.dp": 2, ...}`` (dotted keys, leaf values)."""
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, object] = {}
    for k, v in d.items():
        out.update(flat_keys(v, f"{prefix}{k}."))
    return out
