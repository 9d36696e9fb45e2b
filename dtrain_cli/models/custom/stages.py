"""One pipeline stage of a model of your own (runtime: imports torch).

An ``nn.Sequential`` is cut into its children ``[lo, hi)``, under their own indices. Any
other model keeps the modules of its layer list (``pipeline.layers``) that the stage owns,
in an ``nn.ModuleDict`` keyed by the original index (so parameter names stay the full
model's, and checkpoints reshard between layouts), its ``pipeline.first`` modules on the
first stage and ``pipeline.last`` on the last; the stage runs first -> layers -> last.
"""

from __future__ import annotations

import copy
import types
from collections import OrderedDict
from typing import Any


def stage_module(
    model: Any, stage: Any, attr: str | None, first_names: list[str], last_names: list[str]
) -> Any:
    """The stage's part of ``model`` (a copy; ``stage``: a plan's ``StagePlan``)."""
    from torch import nn

    lo, hi = stage.layers
    part = copy.deepcopy(model)
    if not attr:  # an nn.Sequential: keep the stage's children under their own indices
        kept = OrderedDict((k, m) for i, (k, m) in enumerate(part.named_children()) if lo <= i < hi)
        return nn.Sequential(kept)
    layers = list(getattr(part, attr).children())
    setattr(part, attr, nn.ModuleDict({str(i): layers[i] for i in range(lo, hi)}))
    first = first_names if stage.embeddings else []
    last = last_names if stage.head else []
    for name in set(first_names) - set(first):
        setattr(part, name, None)
    for name in set(last_names) - set(last):
        setattr(part, name, None)

    def forward(self: nn.Module, x: Any) -> Any:
        for name in first:
            x = getattr(self, name)(x)
        for layer in getattr(self, attr).values():
            x = layer(x)
        for name in last:
            x = getattr(self, name)(x)
        return x

    part.forward = types.MethodType(forward, part)
    return part
