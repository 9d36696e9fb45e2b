"""What a model of your own keeps whole under tensor parallel, read off its build and
``parallel.tp_plan`` as :meth:`~dtrain_cli.models.custom.spec.CustomSpec.apply_tensor_parallel`
applies it (torch's ``parallelize_module``: a pattern matches module names as ``fnmatch``
does). A column-wise module splits its weight and bias; a row-wise one its weight, its bias
stays whole; every other parameter (embeddings, norms, a head the plan does not name) is
held whole by every tp rank. What a rank saves for backward stays whole where the module
saving it is a norm or the input of a column-wise module (the residual stream and its
norm, as for the HF kind's plans)."""

from __future__ import annotations

import fnmatch
from typing import Any

SPLIT_ALL = ("colwise", "colwise_rep")
SPLIT_WEIGHT = ("rowwise", "rowwise_rep")


def style_of(plan: dict[str, str], name: str) -> str | None:
    return next((s for k, s in plan.items() if fnmatch.fnmatchcase(name, k)), None)


def matches_any(pattern: str, names: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def tp_replicated(model: Any, plan: dict[str, str]) -> int:
    """Parameters every tp rank holds whole (each tensor once, tied ones too)."""
    seen: set[int] = set()
    whole = 0
    for name, module in model.named_modules():
        style = style_of(plan, name)
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            split = style in SPLIT_ALL or (style in SPLIT_WEIGHT and pname == "weight")
            whole += 0 if split else p.numel()
    return whole


def tp_whole_modules(model: Any, plan: dict[str, str]) -> set[int]:
    """Ids of the modules whose saved tensors every tp rank keeps whole."""
    return {
        id(m)
        for name, m in model.named_modules()
        if style_of(plan, name) in SPLIT_ALL or "norm" in type(m).__name__.lower()
    }
