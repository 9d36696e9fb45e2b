"""Losses by name (``train.loss``): ``cross_entropy``, ``mse``, ``model`` (the model's own
``forward(inputs, targets)`` returns the loss) or a ``_target_`` callable
``(outputs, targets) -> loss``. All in fp32 whatever the autocast dtype."""

from __future__ import annotations

from collections.abc import Callable
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


def model_loss(outputs: Any) -> torch.Tensor:
    """The loss a model returned: a scalar, a tuple whose first item is the loss (as
    ``(loss, logits)``), or an object with ``.loss`` (Hugging Face outputs)."""
    loss = getattr(outputs, "loss", None)
    if loss is None and isinstance(outputs, tuple | list) and outputs:
        loss = outputs[0]
    if loss is None and isinstance(outputs, torch.Tensor):
        loss = outputs
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(outputs).__name__
        raise ValueError(
            f"train.loss=model: forward(inputs, targets) must return a scalar loss, a tuple "
            f"starting with it, or an object with .loss; got {shape}"
        )
    return loss.float()


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
    from dtrain_cli.config.targets import resolve_target

    fn = resolve_target(name, key="train.loss", roots=roots or [])
    if not callable(fn):
        raise ValueError(f"train.loss={name}: not callable")
    return fn  # type: ignore[return-value]
