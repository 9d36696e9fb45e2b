"""Finding a model's repeated blocks without knowing its attribute names."""

from __future__ import annotations

from torch import nn


def largest_module_list(model: nn.Module) -> list[nn.Module]:
    """The children of the model's largest ``nn.ModuleList``/``ModuleDict``/``Sequential``
    of blocks (by parameter count): what FSDP wraps one by one by default."""
    best: list[nn.Module] = []
    best_params = 0
    for module in model.modules():
        if isinstance(module, nn.ModuleList | nn.ModuleDict) or (
            isinstance(module, nn.Sequential) and module is not model
        ):
            children = list(module.children())
            if len(children) < 2:
                continue
            params = sum(p.numel() for p in module.parameters())
            if params > best_params:
                best, best_params = children, params
    return [c for c in best if any(True for _ in c.parameters())]


def modules_named(model: nn.Module, class_names: list[str]) -> list[nn.Module]:
    """Every submodule whose class name is one of ``class_names`` (FSDP units by name)."""
    wanted = set(class_names)
    return [m for m in model.modules() if type(m).__name__ in wanted and m is not model]
