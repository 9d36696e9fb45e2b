"""Checks of ``model.config`` and ``model.pretrained`` against transformers' config classes
(before the model is built; the config class is imported only when keys are given)."""

from __future__ import annotations

import json
import os
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
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    known = config_keys(CONFIG_MAPPING[kind]) if kind in CONFIG_MAPPING else set()
    unknown = [k for k in config if known and k not in known]
    if not unknown:
        return []
    cls = CONFIG_MAPPING[kind].__name__
    more = f" (nor {', '.join(unknown[1:])})" if unknown[1:] else ""
    return [f"model.config.{unknown[0]}: not an argument of {cls}, {where}'s config{more}"]
