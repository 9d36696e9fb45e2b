"""Tensor parallel of ``model=hf`` from the model's own plan: transformers'
``base_model_tp_plan`` (q/k/v and gate/up by columns, o_proj and down_proj by rows, the
embedding over the vocabulary, the LM head gathered) applied with torch's
``parallelize_module`` and the torch ``ParallelStyle`` of each transformers style name.

    dtrain launch recipe=llama_tiny_hf tp=2

A whole model or a pipeline stage (:class:`.net.HFStage` carries its model's plan).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def tp_replicated(model: nn.Module) -> int:
    """Parameters every tp rank holds whole under the model's tp plan: modules the plan
    does not name (norms, position embeddings) and the biases of row-wise layers (added
    after the all-reduce); 0 without a plan."""
    return sum(n for _, n in tp_whole_by_place(model))


def tp_whole_by_place(model: nn.Module) -> list[tuple[str | int, int]]:
    """:func:`tp_replicated` by pipeline place (``ModelFacts.tp_replicated_places``; a
    tied weight at each of its places, as the total has always counted it)."""
    from dtrain_cli.models.spec import whole_by_place

    plan = tp_patterns(model)
    if not plan:
        return []

    def whole(module: str, pname: str) -> bool:
        style = tp_style_of(plan, module)
        return style is None or (style.startswith("rowwise") and pname == "bias")

    return whole_by_place(model, whole)


def tensor_shapes(model: nn.Module) -> list[Any]:
    """Each parameter's shape and pipeline place, with the dimension the model's tp plan
    splits: torch's ColwiseParallel shards a Linear's weight and bias on dim 0 and an
    Embedding's weight on dim 1, RowwiseParallel a Linear's weight on dim 1 (its bias stays
    whole) and an Embedding's on dim 0 (transformers' ``embedding_rowwise``)."""
    from dtrain_cli.models.spec import param_shapes

    plan, modules = tp_patterns(model), dict(model.named_modules())

    def split(name: str) -> int | None:
        module, _, pname = name.rpartition(".")
        style = tp_style_of(plan, module) or ""
        embedding = isinstance(modules.get(module), nn.Embedding)
        if style.startswith("colwise"):
            return 1 if embedding else 0
        if style.startswith(("rowwise", "embedding_rowwise")) and pname == "weight":
            return 0 if embedding else 1
        return None

    return param_shapes(model, split)


def tp_plan(model: nn.Module) -> dict[str, str]:
    """Full-name patterns -> transformers style names: the model's own merged plan
    (``model.tp_plan``: the config's ``base_model_tp_plan`` under the base model's prefix,
    the embedding, the head's ``_tp_plan``). Empty when the config has no base plan (then
    the model has no tensor parallel). A stage carries its model's plan."""
    if hasattr(model, "hf_tp_plan"):  # an HFStage
        return dict(model.hf_tp_plan)
    if not getattr(model.config, "base_model_tp_plan", None):
        return {}
    plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {}
    return dict(plan)


def tp_patterns(model: nn.Module) -> list[tuple[re.Pattern[str], str]]:
    """The plan's names (``model.layers.*.self_attn.q_proj``) as patterns over full module
    names (``*``: a layer index), with their style."""
    return [(re.compile(re.escape(k).replace(r"\*", r"\d+")), v) for k, v in tp_plan(model).items()]


def tp_style_of(plan: list[tuple[re.Pattern[str], str]], name: str) -> str | None:
    return next((style for pattern, style in plan if pattern.fullmatch(name)), None)


def torch_style(name: str) -> Any:
    """transformers' style name -> the torch ``ParallelStyle`` with the same layouts
    (transformers/distributed/tensor_parallel.py registers them the same way)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {
        "colwise": lambda: ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1)),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise": lambda: RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        ),
        "rowwise_rep": lambda: RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        ),
        "embedding_rowwise": lambda: RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate()
        ),
    }
    if name not in styles:
        raise ValueError(f"tensor-parallel style {name!r}: dtrain maps {', '.join(styles)}")
    return styles[name]()


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP from the model's own plan (q/k/v, gate/up by columns, their shared
    input replicated once: :func:`_replicate_input_once`; o_proj, down_proj by rows; the
    embedding over the vocabulary; the LM head gathered). A whole model or an HFStage."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tp_patterns(model)
    if not plan:
        raise ValueError(f"model_type={model.config.model_type}: no base_model_tp_plan")
    modules, shared = dict(model.named_modules()), Counter()  # column-wise children
    for name, module in modules.items():
        style = tp_style_of(plan, name)
        if style is not None:
            parallelize_module(module, tp_mesh, torch_style(style))
            shared[name.rpartition(".")[0]] += style == "colwise"
    for parent in (p for p, n in shared.items() if n > 1):
        _replicate_input_once(modules[parent], tp_mesh)


def _replicate_input_once(module: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Its input (first argument or ``hidden_states``) as one replicated DTensor, so the
    column-wise children's input gradients are summed and all-reduced once: 4 all-reduces
    a Llama layer, not 7 (one per column-wise input). What torch's ``PrepareModuleInput``
    does, but that style must be told whether the input comes as the first argument
    (``mlp(x)``) or as the keyword ``hidden_states`` (``self_attn(hidden_states=...)``),
    which the calling layer decides and which differs between modules and families."""
    from torch.distributed.tensor import DTensor, Replicate

    def rep(x: Any) -> Any:
        plain = isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
        return DTensor.from_local(x, tp_mesh, (Replicate(),), run_check=False) if plain else x

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (rep(args[0]), *args[1:]), kwargs
        return args, {k: rep(v) if k == "hidden_states" else v for k, v in kwargs.items()}

    module.register_forward_pre_hook(hook, with_kwargs=True)
