"""Model kinds behind one seam (:mod:`.spec`), chosen by ``model.kind``.

    dtrain launch recipe=gpt_small                        # kind gpt (built in)
    dtrain launch recipe=cnn_bn dp=2 parallel.sync_batchnorm=true   # kind cnn_bn (built in)
    dtrain launch model=custom model._target_=my_models.net.Net data=custom ...
    dtrain launch recipe=llama_tiny_hf dp=2               # kind hf (transformers)

A new kind is a package here (its typed config dataclass, its torch-free
:class:`ModelSpec` subclass, its torch module), added to :data:`KINDS` and given a
``configs/model/<option>.yaml``. Importing this
package imports no torch; the built-in kinds' config modules do not either.
"""

from __future__ import annotations

import importlib
from dataclasses import fields, is_dataclass
from typing import Any

from dtrain_cli.models.spec import ModelFacts, ModelSpec

__all__ = ["KINDS", "ModelFacts", "ModelSpec", "model_spec", "spec_class", "typed_model_config"]

KINDS: dict[str, str] = {
    "gpt": "dtrain_cli.models.gpt.spec:GPTSpec",
    "cnn_bn": "dtrain_cli.models.cnn.spec:CNNSpec",
    "custom": "dtrain_cli.models.custom.spec:CustomSpec",
    "hf": "dtrain_cli.models.hf.spec:HFSpec",
}
# Kinds whose config takes keys the schema cannot know (keyword arguments of the user's
# class, a transformers config): the path under ``model`` that is open for new keys.
OPEN_KEYS: dict[str, str] = {"custom": "model.", "hf": "model.config."}


class UnknownModelKind(ValueError):
    pass


def spec_class(kind: str) -> type[ModelSpec]:
    if kind not in KINDS:
        raise UnknownModelKind(
            f"model.kind={kind}: not a model kind; choose one of {', '.join(KINDS)}"
        )
    module, attr = KINDS[kind].split(":")
    return getattr(importlib.import_module(module), attr)


def typed_model_config(node: Any) -> Any:
    """The typed config of a model node: already typed (Hydra built it from the kind's
    schema), or a plain mapping read back from ``config.yaml`` (checked against it)."""
    if is_dataclass(node):
        return node
    data = dict(node)
    cls = spec_class(str(data.get("kind", "gpt"))).config_class
    if hasattr(cls, "from_dict"):
        return cls.from_dict(data)
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), data))


def model_spec(run: Any) -> ModelSpec:
    """The spec of a run's model (``run``: a :class:`DtrainConfig`)."""
    return spec_class(run.model.kind)(run.model, run)


def schema_classes() -> dict[str, type]:
    """``<kind>_schema`` -> typed config class, for Hydra's ConfigStore (group ``model``)."""
    out = {}
    for kind in KINDS:
        cls = spec_class(kind).config_class
        if is_dataclass(cls) and not hasattr(cls, "from_dict"):
            out[f"{kind}_schema"] = cls
    return out


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)] if is_dataclass(cls) else []
