"""Checks of a Hugging Face model's sizes, from its meta-build counts: the attention heads
its key/value heads are shared among, and for tensor parallel the model's own tp plan
(``base_model_tp_plan``) in styles dtrain maps and the sizes that tp divides.
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


def head_problems(c: dict[str, Any]) -> list[str]:
    """Grouped-query attention shares each key/value head among heads / kv_heads query heads:
    a config whose kv heads do not divide its heads builds, and fails in its first forward
    (gemma's default num_key_value_heads=16 under num_attention_heads=4)."""
    heads, kv = c["heads"], c["kv_heads"]
    if not heads or not kv or heads % kv == 0:
        return []
    fits = [k for k in range(1, heads + 1) if heads % k == 0]
    return [
        f"model.config.num_key_value_heads={kv}: must divide model.config.num_attention_heads="
        f"{heads} (each key/value head serves heads / kv heads query heads); use one of {fits}"
    ]


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
