"""Checks of ``model.config`` and ``model.pretrained`` against transformers' config classes
(before the model is built; the config class is imported only when keys are given)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any


def config_keys(cls: type) -> set[str]:
    """Keyword arguments a transformers config accepts: its dataclass fields (v5 configs are
    dataclasses, base fields included) and their aliases (``n_layer`` for GPT-2); empty (no
    check) for a config class that is not a dataclass."""
    import dataclasses

    if not dataclasses.is_dataclass(cls):
        return set()
    keys = {f.name for f in dataclasses.fields(cls)}
    keys |= set(getattr(cls, "attribute_map", {}) or {})
    return keys | {"rope_theta", "rope_scaling", "tie_word_embeddings"}


SHAPE_KEYS = frozenset(
    {
        "vocab_size",
        "hidden_size",
        "n_embd",
        "d_model",
        "num_hidden_layers",
        "n_layer",
        "intermediate_size",
        "n_inner",
        "num_attention_heads",
        "n_head",
        "num_key_value_heads",
        "head_dim",
        "n_positions",
    }
)
"""``model.config`` keys that set a weight's shape: given over ``model.pretrained`` with
another value, its weights do not fit (a missing/mismatched LOAD REPORT and a traceback at
start-up, or layers dropped without a word). Not ``max_position_embeddings``: a rotary
model's context is set there without a weight."""


def pretrained_problems(
    pretrained: str, model_type: str | None, config: dict[str, Any]
) -> list[str]:
    """A local model folder's ``config.json`` against what the command line says of it: a
    ``model.model_type`` it is not (the run was labelled gpt2 and trained a llama) and
    ``model.config`` keys its config class does not take (``from_pretrained`` ignored them)."""
    where = f"model.pretrained={pretrained}"
    try:
        saved = json.loads((Path(os.path.expanduser(pretrained)) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"{where}: config.json cannot be read ({exc})"]
    kind = str(saved.get("model_type", ""))
    if model_type and kind and model_type != kind:
        return [
            f"model.model_type={model_type}: {where} holds a {kind} model (its config.json); "
            "drop model.model_type"
        ]
    if not config or not kind:
        return []
    given = [k for k in config if k in SHAPE_KEYS and saved.get(k) is not None]  # null: derived
    if reshaped := [k for k in given if config[k] != saved[k]]:
        k = reshaped[0]
        return [
            f"model.config.{k}={config[k]}: {where}'s config.json has {k}={saved[k]}, and its "
            "weights that shape (they would not load, or load in part); drop the key, or "
            "leave model.pretrained unset to train a new model of that shape"
        ]
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    known = config_keys(CONFIG_MAPPING[kind]) if kind in CONFIG_MAPPING else set()
    unknown = [k for k in config if known and k not in known]
    if not unknown:
        return []
    cls = CONFIG_MAPPING[kind].__name__
    more = f" (nor {', '.join(unknown[1:])})" if unknown[1:] else ""
    return [f"model.config.{unknown[0]}: not an argument of {cls}, {where}'s config{more}"]


def config_error(model: Any, exc: BaseException) -> str:
    """transformers' refusal of ``model.config`` (or the folder's), one line: a field's
    validation error (huggingface_hub's strict dataclasses, a traceback before:
    ``model.config.num_hidden_layers=three``) names the key and the type it takes."""
    named = re.match(r"Validation error for field '(\w+)'", str(exc))
    if named:
        key = named.group(1)
        why = (str(exc.__cause__ or exc).strip().splitlines() or [type(exc).__name__])[0]
        if key in model.config:
            return f"model.config.{key}={model.config[key]}: {why}"
        where = f"model.pretrained={model.pretrained}" if model.pretrained else "model.config"
        return f"{where}: {why}"
    where = f"model.pretrained={model.pretrained}" if model.pretrained else "model.config"
    return f"{where}: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
