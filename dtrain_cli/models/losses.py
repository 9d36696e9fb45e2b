"""Losses by name (``train.loss``): ``cross_entropy``, ``mse``, ``model`` (the model's own
``forward(inputs, targets)`` returns the loss) or a ``_target_`` callable
``(outputs, targets) -> loss``. All in fp32 whatever the autocast dtype."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
BUILTIN_LOSSES = ("cross_entropy", "mse", "model")


def cross_entropy(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over every position: class scores on the last dim, class indices
    as targets (next tokens of a language model, one label per image)."""
    logits = _tensor(outputs)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"train.loss=cross_entropy: outputs {tuple(logits.shape)} need targets of shape "
            f"{tuple(logits.shape[:-1])} (class indices), got {tuple(targets.shape)}"
        )
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def mse(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    pred = _tensor(outputs)
    if pred.shape != targets.shape:
        raise ValueError(
            f"train.loss=mse: outputs {tuple(pred.shape)} and targets {tuple(targets.shape)} "
            f"differ in shape"
        )
    return F.mse_loss(pred.float(), targets.float())


MODEL_LOSS_FORMS = (
    "a scalar tensor, a dict with a scalar 'loss', a tuple or list whose first item is the "
    "scalar loss, or an object with a scalar .loss (Hugging Face outputs)"
)


def model_loss(outputs: Any) -> torch.Tensor:
    """The loss a model returned (``train.loss=model``): one of :data:`MODEL_LOSS_FORMS`;
    anything else is a ValueError that says what came back."""
    if isinstance(outputs, Mapping):
        loss = outputs.get("loss")
    elif isinstance(outputs, tuple | list):
        loss = outputs[0] if outputs else None
    elif isinstance(outputs, torch.Tensor):
        loss = outputs
    else:
        loss = getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss.float()
    raise ValueError(
        f"train.loss=model: forward(inputs, targets) returned {describe(outputs)}; "
        f"accepted: {MODEL_LOSS_FORMS}"
    )


def describe(value: Any, depth: int = 0) -> str:
    """What a forward returned, in a few words: ``a tuple (tensor (8, 5), tensor ())``."""
    if isinstance(value, torch.Tensor):
        return (
            f"tensor {tuple(value.shape)}" if depth else f"a tensor of shape {tuple(value.shape)}"
        )
    if depth > 1:
        return type(value).__name__
    if isinstance(value, Mapping):
        items = ", ".join(f"{k!r}: {describe(v, depth + 1)}" for k, v in list(value.items())[:4])
        more = ", ..." if len(value) > 4 else ""
        return f"a {type(value).__name__} {{{items}{more}}}" if value else "an empty dict"
    if isinstance(value, tuple | list):
        items = ", ".join(describe(v, depth + 1) for v in value[:4])
        more = ", ..." if len(value) > 4 else ""
        return (
            f"a {type(value).__name__} ({items}{more})"
            if value
            else f"an empty {type(value).__name__}"
        )
    if hasattr(value, "loss"):
        return f"a {type(value).__name__} whose .loss is {describe(value.loss, depth + 1)}"
    return f"a {type(value).__name__}" if not depth else type(value).__name__


def _tensor(outputs: Any) -> torch.Tensor:
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(outputs, tuple | list) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    raise ValueError(f"the model returned {type(outputs).__name__}; the loss needs a tensor")


def resolve_loss(name: str, roots: list[str] | None = None) -> LossFn | None:
    """The loss function for ``train.loss`` (None for ``model``: the model computes it)."""
    if name == "cross_entropy":
        return cross_entropy
    if name == "mse":
        return mse
    if name == "model":
        return None
    from dtrain_cli.targets import resolve_target

    fn = resolve_target(name, key="train.loss", roots=roots or [])
    if not callable(fn):
        raise ValueError(f"train.loss={name}: not callable")
    return _scalar_checked(name, fn)


def _scalar_checked(name: str, fn: Callable[..., Any]) -> LossFn:
    """``fn``, with what it returns checked: a loss that is not one number (``reduction=
    'none'``) stopped in backward with torch's 'grad can be implicitly created only for
    scalar outputs'."""

    @functools.wraps(fn)
    def loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        value = fn(outputs, targets)
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            return value
        raise ValueError(
            f"train.loss={name}: returned {describe(value)}; accepted: a scalar tensor "
            "(reduce it, e.g. with .mean())"
        )

    return loss
