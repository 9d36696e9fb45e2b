"""A model of your own under tensor parallel: ``parallel.tp_plan`` applied (:func:`apply_tp_plan`:
torch's ``parallelize_module``, a pattern matching module names as ``fnmatch`` does), and
what that keeps whole, read off the build and the plan. A column-wise module splits its
weight and bias; a row-wise one its weight, its bias stays whole; every other parameter
(embeddings, norms, a head the plan does not name) is held whole by every tp rank. What a
rank saves for backward stays whole where the module saving it is a norm or a column-wise
module (its input: the residual stream and its norm), the rule every kind shares."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import Any

TP_STYLES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence")
"""What ``parallel.tp_plan`` may name: torch's ``ColwiseParallel``, ``RowwiseParallel`` (the
``_rep`` forms with a replicated output/input) and ``SequenceParallel``."""
SPLIT_ALL = ("colwise", "colwise_rep")
SPLIT_WEIGHT = ("rowwise", "rowwise_rep")


def matches(pattern: str, name: str) -> bool:
    """As torch's ``parallelize_module`` reads a plan's key: one ``fnmatch`` pattern per
    level of the module path (``blocks.*`` is ``blocks.0``, not ``blocks.0.fc1``)."""
    atoms, parts = pattern.split("."), name.split(".")
    return len(atoms) == len(parts) and all(
        fnmatch.fnmatchcase(part, atom) for part, atom in zip(parts, atoms, strict=True)
    )


def style_of(plan: dict[str, str], name: str) -> str | None:
    return next((s for k, s in plan.items() if matches(k, name)), None)


def matches_any(pattern: str, names: set[str]) -> bool:
    return any(matches(pattern, n) for n in names)


def _held_whole(plan: dict[str, str]) -> Any:
    """(module name, parameter name) -> whether every tp rank holds it whole."""

    def whole(module: str, pname: str) -> bool:
        style = style_of(plan, module)
        return not (style in SPLIT_ALL or (style in SPLIT_WEIGHT and pname == "weight"))

    return whole


def tp_replicated(model: Any, plan: dict[str, str]) -> int:
    """Parameters every tp rank holds whole (each tensor once, tied ones too)."""
    from dtrain_cli.models.spec import whole_by_place

    return sum(n for _, n in whole_by_place(model, _held_whole(plan), tied_once=True))


def tp_whole_by_place(model: Any, plan: dict[str, str]) -> list[tuple[str | int, int]]:
    """:func:`tp_replicated` by pipeline place (``ModelFacts.tp_replicated_places``)."""
    from dtrain_cli.models.spec import whole_by_place

    return whole_by_place(model, _held_whole(plan)) if plan else []


def tp_whole_modules(model: Any, plan: dict[str, str]) -> set[int]:
    """Ids of the modules whose saved tensors every tp rank keeps whole
    (:func:`dtrain_cli.models.saved_bytes.kept_whole_under_tp`)."""
    from dtrain_cli.models.saved_bytes import kept_whole_under_tp

    return kept_whole_under_tp(model, lambda name: style_of(plan, name))


def _tied_problems(modules: dict[str, Any], plan: dict[str, str]) -> list[str]:
    """A module the plan splits that holds a tied parameter (a head tied to the embedding):
    ``parallelize_module`` gives it a DTensor of its own and the other module keeps the
    plain tensor, so the two train apart (the run trained untied without a word)."""
    owners: dict[int, list[str]] = {}
    for name, module in modules.items():
        for pname, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append(f"{name}.{pname}")
    out = []
    for names in (v for v in owners.values() if len(v) > 1):
        split = [n for n in names if style_of(plan, n.rsplit(".", 1)[0]) is not None]
        if split:
            module = " and ".join(dict.fromkeys(n.rsplit(".", 1)[0] for n in split))
            out.append(
                f"parallel.tp_plan: splits {split[0]}, which is tied to "
                f"{', '.join(n for n in names if n != split[0])}: tensor parallel would give "
                f"each its own copy, trained apart; leave {module} out of parallel.tp_plan (a "
                "tied parameter stays whole on every tp rank) or untie them in your model"
            )
    return out


def _per_module(model: Any, plan: dict[str, str]) -> dict[str, str]:
    """``plan`` with ``rowwise`` on an ``nn.Embedding`` as ``rowwise_rep``: torch's
    ``RowwiseParallel`` takes its input as split over the last dim by default, which token
    ids never are (an Embedding's rows are its vocabulary; the ids were all-gathered into
    a sequence tp times as long)."""
    from torch import nn

    out: dict[str, str] = {}
    for pattern, style in plan.items():
        named = [(n, m) for n, m in model.named_modules() if n and matches(pattern, n)]
        if style == "rowwise" and any(isinstance(m, nn.Embedding) for _, m in named):
            for n, m in named:
                out[n] = "rowwise_rep" if isinstance(m, nn.Embedding) else style
        elif named:
            out[pattern] = style
    return out


def apply_tp_plan(model: Any, tp_mesh: Any, plan: dict[str, str]) -> None:
    """torch's ``parallelize_module`` with the styles ``plan`` names; a pattern no module of
    ``model`` matches is left out (a pipeline stage may lack it)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    styles = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence": SequenceParallel,
    }
    per_module = _per_module(model, plan)
    parallelize_module(model, tp_mesh, {k: styles[v]() for k, v in per_module.items()})


def example_tp_plan(model: Any, blocks: list[Any]) -> str:
    """A ``parallel.tp_plan`` override in the model's own names, for an error's hint: its
    first block's last two Linear layers (an MLP's pair: column-wise, then row-wise) under
    the blocks' pattern (``blocks.0`` -> ``blocks.*``); placeholders without them."""
    from torch import nn

    pattern, pair = "blocks.*", ["fc1", "fc2"]
    if model is not None and blocks:
        prefix = next((n for n, m in model.named_modules() if m is blocks[0]), "")
        linears = [n for n, m in blocks[0].named_modules() if isinstance(m, nn.Linear)]
        if prefix and len(linears) >= 2:
            pattern, pair = re.sub(r"[^.]+$", "*", prefix), linears[-2:]
    return f"'parallel.tp_plan={{{pattern}.{pair[0]}:colwise,{pattern}.{pair[1]}:rowwise}}'"


def tp_plan_hint(spec: Any) -> str:
    """The end of the error line for tp > 1 without ``parallel.tp_plan``: what to give, in
    the model's own names (:func:`example_tp_plan`); a model that does not build says so
    on a line of its own, and the hint keeps placeholders."""
    try:
        model = spec.meta_model()
        example = example_tp_plan(model, spec._blocks(model))
    except Exception:
        example = example_tp_plan(None, [])
    return (
        "; give one over your blocks' Linear layers, column-wise the first of a pair and "
        f"row-wise the second: {example}"
    )


def tp_plan_problems(
    meta_model: Callable[[], Any], plan: dict[str, str], tp: int, target: str
) -> list[str]:
    """What ``parallel.tp_plan`` asks that no step can do: a style torch lacks; at tp > 1,
    what the model's own (meta) build rules out before a step fails on it: a pattern that
    matches no module (it splits nothing), a split style on a module torch's styles cannot
    split (only ``nn.Linear`` and ``nn.Embedding``), a column-wise Embedding, a split of a
    tied parameter, column-wise layers with no row-wise one to read their split output."""
    from torch import nn

    if bad := {k: v for k, v in plan.items() if v not in TP_STYLES}:
        return [
            f"parallel.tp_plan: unknown style {', '.join(f'{k}={v}' for k, v in bad.items())}; "
            f"choose one of {', '.join(TP_STYLES)}"
        ]
    if not plan or tp <= 1:
        return []
    modules = {n: m for n, m in meta_model().named_modules() if n}
    splittable = [n for n, m in modules.items() if isinstance(m, nn.Linear | nn.Embedding)]
    out = []
    if unmatched := [k for k in plan if not matches_any(k, set(modules))]:
        shown = ", ".join(splittable[:6]) + (", ..." if len(splittable) > 6 else "")
        out.append(
            f"parallel.tp_plan: {', '.join(unmatched)} matches no module of {target} (one "
            f"pattern per level of the name), so nothing would be split there; its Linear "
            f"and Embedding layers: {shown}"
        )
    for pattern, style in plan.items():
        named = {n: m for n, m in modules.items() if matches(pattern, n)}
        wrong = sorted({type(m).__name__ for m in named.values()} - {"Linear", "Embedding"})
        if wrong and style in SPLIT_ALL + SPLIT_WEIGHT:
            inside = [n for n in splittable if any(n.startswith(f"{k}.") for k in named)]
            hint = f" (inside: {', '.join(inside[:4])})" if inside else ""
            out.append(
                f"parallel.tp_plan: {pattern}:{style} names {', '.join(wrong)} modules; a "
                f"{style} split takes nn.Linear and nn.Embedding layers only{hint}"
            )
        if style == "colwise" and any(isinstance(m, nn.Embedding) for m in named.values()):
            out.append(
                f"parallel.tp_plan: {pattern}:colwise splits an Embedding's features over the "
                "tp ranks, and the layers after it (the residual stream, a norm) need all of "
                f"them; use {pattern}:rowwise (its vocabulary split, its output whole; a "
                "factorized embedding's projection then splits as any Linear)"
            )
    out += _tied_problems(modules, plan)
    if out:
        return out
    columns = [k for k, v in plan.items() if v == "colwise"]
    if columns and "rowwise" not in plan.values():
        out.append(
            f"parallel.tp_plan: {', '.join(columns)} column-wise and no layer row-wise: a "
            "column-wise layer's output stays split over the tp ranks, and the layer that reads "
            "it gets a part of its features; name that layer rowwise, or give colwise_rep"
        )
    return out
