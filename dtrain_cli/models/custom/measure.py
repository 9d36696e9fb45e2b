"""What a model of your own saves for backward, measured once for the plan
(:mod:`dtrain_cli.models.saved_bytes`): one sample of the token windows it will train on,
its forward and loss, under torch's ``FakeTensorMode`` on CPU. No memory and no compute,
but the kernels a real run picks: ``F.scaled_dot_product_attention`` takes its fused kernel
and keeps no s x s scores, as flash attention does on a GPU, where the meta device falls back
to the math kernel that keeps them (1.35x the bytes on a 4-block model of width 128 at
sequence 128). Measured in fp32, then under bf16 autocast over fp32 parameters and with
bf16 parameters (:func:`~dtrain_cli.models.saved_bytes.measure_low_precision`), so a model
that computes some ops in fp32 (a norm that upcasts; autocast's fp32 ops, layer_norm among
them) is planned with what it keeps. A model whose build or forward does not run under fake
tensors is measured on the meta device (fp32; its bf16 bytes are then halved).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

from dtrain_cli.models.saved_bytes import measure_low_precision, measure_saved

Measure = Callable[[Any], dict[str, float] | None]


def saved_records(
    *,
    block_size: int,
    forward_loss: Callable[[Any, Any], Any],
    build: Callable[[], Any],
    meta_model: Callable[[], Any],
    layer_list: Callable[[Any], list[Any]],
    tp_whole: Callable[[Any], set[int]] = lambda _m: set(),
) -> tuple[dict[str, Any], bool]:
    """({"saved": one sample's fp32 bytes or None, and where measured "saved_autocast" and
    "saved_bf16"}, whether the measurement completed). ``build()`` instantiates the model
    (here under fake tensors), ``meta_model()`` is its meta build, ``layer_list(model)`` its
    repeated blocks, ``tp_whole(model)`` the ids of the modules tp keeps whole
    (:mod:`.tp_layout`)."""
    failed: list[str] = []
    with _fake_cpu() as fake:
        model = _built(build) if fake else None
        if model is not None:
            measure = _measure(block_size, forward_loss, layer_list, tp_whole, failed=failed)
            saved = measure(model)
            if saved is not None:
                return {"saved": saved, **measure_low_precision(model, measure)}, True
    measure = _measure(block_size, forward_loss, layer_list, tp_whole, "meta", failed=failed)
    saved = measure(meta_model())
    if saved is None and failed:  # the forward raised on both: a step would too, most likely
        return {"saved": None, "saved_error": failed[-1]}, True
    return {"saved": saved}, saved is not None


def forward_loss_for(
    loss: str, import_roots: list[str], fallback: Callable[[Any, Any], Any]
) -> Callable[[Any, Any], Any]:
    """The forward and loss a training step runs: ``train.loss`` resolved (``model``: the
    model returns its own loss), else ``fallback``. Raises when the loss does not resolve."""
    from dtrain_cli.models.losses import model_loss, resolve_loss

    loss_fn = resolve_loss(loss, import_roots) or fallback

    def forward_loss(model: Any, inputs: Any) -> Any:
        if loss == "model":
            return model_loss(model(inputs, inputs))
        return loss_fn(model(inputs), inputs)

    return forward_loss


def _measure(
    block_size: int,
    forward_loss: Callable[[Any, Any], Any],
    layer_list: Callable[[Any], list[Any]],
    tp_whole: Callable[[Any], set[int]],
    device: str = "cpu",
    failed: list[str] | None = None,
) -> Measure:
    """One sample's saved bytes on ``model`` (None when its forward or loss fails: the
    exception's first line is appended to ``failed``)."""
    import torch

    def measure(model: Any) -> dict[str, float] | None:
        x = torch.zeros(1, int(block_size), dtype=torch.long, device=device)
        try:
            blocks = layer_list(model)
            return asdict(measure_saved(model, blocks, x, forward_loss, tp_whole(model)))
        except Exception as exc:  # the user's forward, their loss
            if failed is not None:
                first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
                failed.append(f"{type(exc).__name__}: {first}"[:300])
            return None

    return measure


@contextlib.contextmanager
def _fake_cpu() -> Iterator[bool]:
    """torch's ``FakeTensorMode`` with CPU as the default device (False: unavailable)."""
    import torch

    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:  # a torch without it: the meta device measures
        yield False
        return
    # a forward that raises under fake tensors is logged by torch with its whole traceback
    # (100 lines of "failed while attempting to run meta"): the plan says it in one line
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # setLevel: clears the loggers' cached levels
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), torch.device("cpu"):
            yield True
    finally:
        quiet.setLevel(level)


def _built(build: Callable[[], Any]) -> Any:
    """The model built under the active fake mode, or None when its constructor cannot run
    on fake tensors (reads a value, converts to numpy...)."""
    try:
        return build()
    except Exception:
        return None


def count_batchnorm(model: Any) -> int:
    from torch.nn.modules.batchnorm import _BatchNorm

    return sum(isinstance(m, _BatchNorm) for m in model.modules())
