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


PP_HINT = (
    ": it is not an nn.Sequential; name its layer list with pipeline.layers=<attribute> "
    "(and pipeline.first / pipeline.last for the modules before and after it)"
)


def pp_hint(model: Any) -> str:
    """:data:`PP_HINT`, with the model's own names where it has a list of layers: its
    largest ``nn.ModuleList`` (or ``nn.Sequential``) and the modules registered before and
    after it, in the order its forward should run them."""
    from torch import nn

    def size(module: Any) -> int:
        return sum(p.numel() for p in module.parameters())

    lists = [
        (size(child), name)
        for name, child in model.named_children()
        if isinstance(child, nn.ModuleList | nn.Sequential) and len(child) > 1
    ]
    if not lists:
        return PP_HINT
    attr = max(lists)[1]
    ends = unstaged_modules(model, attr, [], [])
    keys = [f"pipeline.layers={attr}"] + [
        f"'pipeline.{end}=[{','.join(n for n, w in ends if w == end)}]'"
        for end in ("first", "last")
        if any(w == end for _, w in ends)
    ]
    own = [n for n, w in ends if w == "own"]
    own_said = (
        f"; its own parameters or buffers ({', '.join(own)}) would run on no stage" if own else ""
    )
    return (
        f": it is not an nn.Sequential; name its layer list and what runs before and after "
        f"it, as its forward runs them: {' '.join(keys)}{own_said}"
    )


def unstaged_modules(model: Any, attr: str | None, first: list[str], last: list[str]) -> list:
    """``[name, where]`` for each module of ``model`` that holds parameters or buffers and
    that no stage would run: neither the layer list ``attr`` nor ``pipeline.first``/``last``.
    ``where``: first or last by where the model registers it beside ``attr``; ``own`` for
    parameters and buffers of the model itself (only its forward, which a stage replaces,
    uses them: a position table it adds was silently left out of a stage's forward)."""
    if not attr:
        return []
    out, seen_layers = [], False
    for name, child in model.named_children():
        seen_layers = seen_layers or name == attr
        holds = any(True for _ in child.parameters()) or any(True for _ in child.buffers())
        if name not in (attr, *first, *last) and holds:
            out.append([name, "last" if seen_layers else "first"])
    own = [n for n, _ in model.named_parameters(recurse=False)]
    own += [n for n, _ in model.named_buffers(recurse=False)]
    return out + [[name, "own"] for name in own]


def layer_list(model: Any, attr: str | None, target: str) -> list[Any]:
    """The layers pipeline stages split: ``pipeline.layers`` (``attr``) or an
    ``nn.Sequential``'s."""
    from torch import nn

    if attr:
        layers = getattr(model, attr, None)
        if not isinstance(layers, nn.ModuleList | nn.Sequential | nn.ModuleDict):
            raise ValueError(
                f"pipeline.layers={attr}: {target} has no nn.ModuleList/Sequential "
                f"attribute {attr!r}"
            )
        return list(layers.children())
    if isinstance(model, nn.Sequential):
        return list(model.children())
    return []


def tied_owners(model: Any) -> list[list[Any]]:
    """Each parameter held under two names or more (a head tied to the embedding): every
    name with the (path, class name) of the modules above it, outermost first; what the
    plan checks ``parallel.fsdp_units`` against without building the model again."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    # a module under two names (an ALBERT-style shared block, an alias) is one FSDP unit:
    # every name of it stands for its first
    first: dict[int, str] = {}
    modules: dict[str, tuple[str, str]] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        if path:
            modules[path] = (first.setdefault(id(m), path), type(m).__name__)
    out = []
    for group in (g for g in names.values() if len(g) > 1):
        entry = []
        for name in group:
            parts = name.split(".")[:-1]
            above = [modules[".".join(parts[: i + 1])] for i in range(len(parts))]
            entry.append([name, [list(a) for a in above]])
        out.append(entry)
    return out


def tied_across_stages(model: Any, attr: str | None) -> list[str]:
    """The names of the first parameter that two places a pipeline may put on different
    stages share (a head tied to the embedding, layers sharing weights): each stage would
    hold a copy and train it apart. Places: each top-level module, each layer of ``attr``
    (each child of an ``nn.Sequential``, ``attr`` None)."""
    places: dict[int, dict[str, str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        top, _, rest = name.partition(".")
        place = f"{top}.{rest.partition('.')[0]}" if top == attr else top
        places.setdefault(id(p), {}).setdefault(place, name)
    return next((list(names.values()) for names in places.values() if len(names) > 1), [])


def unstaged_problem(target: str, attr: str, unstaged: list) -> str:
    """One line: what no stage runs, and the pipeline.first / pipeline.last that would."""
    cls = target.rsplit(".", 1)[-1]
    names = [n for n, where in unstaged if where != "own"]
    own = [n for n, where in unstaged if where == "own"]
    parts = []
    if names:
        ends = [
            f"pipeline.{end}=[{','.join(n for n, w in unstaged if w == end)}]"
            for end in ("first", "last")
            if any(w == end for _, w in unstaged)
        ]
        one = len(names) == 1
        parts.append(
            f"{cls}'s {' and '.join(names)}, which {'holds' if one else 'hold'} parameters or "
            f"buffers: "
            f"name {'it' if one else 'them'} as its forward runs {'it' if one else 'them'} "
            f"beside {attr}, e.g. {' '.join(ends)}"
        )
    if own:
        parts.append(
            f"{cls}'s own parameters or buffers ({', '.join(own)}), used only by its forward, "
            "which a stage replaces: keep them in a module named in pipeline.first or "
            "pipeline.last"
        )
    return f"pipeline.layers={attr}: no pipeline stage runs " + "; nor ".join(parts)


def tied_problem(attr: str | None, tied: list[str], pp: int) -> str:
    """One line: a parameter two stages would each hold a copy of."""
    return (
        f"{f'pipeline.layers={attr}' if attr else f'parallel.pp={pp}'}: {' and '.join(tied)} are "
        "one tied parameter, which two "
        "pipeline stages would each hold a copy of and train apart; untie them or use pp=1"
    )
