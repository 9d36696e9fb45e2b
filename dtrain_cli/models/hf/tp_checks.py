"""Tensor-parallel checks of a Hugging Face model, from its meta-build counts: the model's own
tp plan (``base_model_tp_plan``) in styles dtrain maps, and sizes that tp divides.
"""

from __future__ import annotations

from typing import Any

TP_STYLES = (
    "colwise",
    "rowwise",
    "colwise_gather_output",
    "colwise_rep",
    "rowwise_split_input",
    "rowwise_rep",
    "embedding_rowwise",
)
"""transformers' tp style names that :func:`.tensor_parallel.torch_style` maps to torch styles."""


def tp_problems(tp: int, model_type: str, c: dict[str, Any]) -> list[str]:
    """What stops ``parallel.tp=tp`` on an HF model (``c``: its meta-build counts)."""
    if not c["tp_plan"]:
        return [
            f"parallel.tp={tp}: model.model_type={model_type} has no base_model_tp_plan "
            f"in transformers; use tp=1 (or a family with one, e.g. llama, qwen2, mistral)"
        ]
    unknown = sorted({s for s in c["tp_plan"].values() if s not in TP_STYLES})
    if unknown:
        return [
            f"parallel.tp={tp}: model.model_type={model_type}'s tp plan uses "
            f"{', '.join(unknown)}; dtrain maps {', '.join(TP_STYLES)}; use tp=1"
        ]
    sizes = {
        "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv_heads"],
        "hidden_size": c["hidden"],
        "intermediate_size": c["intermediate"],
        "vocab_size": c["vocab"],
    }
    bad = {k: v for k, v in sizes.items() if v and v % tp}
    if not bad:
        return []
    allowed = [
        t for t in range(1, c["kv_heads"] + 1) if all(v % t == 0 for v in sizes.values() if v)
    ]
    return [
        f"parallel.tp={tp}: must divide "
        + ", ".join(f"model.config.{k}={v}" for k, v in bad.items())
        + f"; use tp in {allowed}"
    ]
