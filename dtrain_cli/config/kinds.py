"""Which model and data options a composition picks, read before Hydra composes: the
override checks need the chosen model kind's keys (``model.*`` belong to the kind,
dtrain_cli/models) and the keys open to anything (a custom model's or dataset's keyword
arguments, a transformers config: ``dtrain_cli.models.OPEN_KEYS``).

    dtrain plan model=custom model._target_=my_models.net.Net model.width=256
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dtrain_cli.config.overrides import Field, schema_fields


def kind_keys(recipe_path: Path, overrides: Sequence[str], search: Sequence[Path]) -> dict:
    """What the override checks need to know of the chosen model and data options: the
    model kind's own keys (``model.*`` belong to the kind, dtrain_cli/models) and the keys
    open to anything (a custom model's or dataset's keyword arguments, a transformers
    config: ``dtrain_cli.models.OPEN_KEYS``)."""
    from dtrain_cli.models import OPEN_KEYS, UnknownModelKind, spec_class

    option = _group_option("model", recipe_path, overrides)
    kind = _option_kind(option, search) if option else None
    extra: dict[str, Field] = {}
    open_prefixes: list[str] = []
    label = None
    if kind:
        try:
            cls = spec_class(kind).config_class
        except (UnknownModelKind, ImportError):
            cls = None
        if cls is not None and not hasattr(cls, "from_dict"):
            extra = schema_fields(cls, "model.")
        if kind in OPEN_KEYS:
            open_prefixes.append(OPEN_KEYS[kind])
        label = f"model={option} (kind {kind})"
    data_option = _group_option("data", recipe_path, overrides)
    if data_option and _option_value("data", data_option, "source", search) == "custom":
        open_prefixes.append("data.")
    return {"extra": extra, "open_prefixes": tuple(open_prefixes), "model_label": label}


def _group_option(group: str, recipe_path: Path, overrides: Sequence[str]) -> str | None:
    """The option of ``group`` this composition picks: the last ``group=x`` override, else
    the recipe's ``override /group: x``."""
    for ov in reversed(overrides):
        if ov.startswith(f"{group}="):
            return ov.split("=", 1)[1]
    try:
        defaults = OmegaConf.load(recipe_path).get("defaults") or []
    except Exception:  # an unreadable recipe: Hydra reports it
        return None
    for item in defaults:
        if isinstance(item, dict | DictConfig):
            for k, v in dict(item).items():
                if str(k).replace("override", "").strip().strip("/") == group:
                    return str(v)
    return None


def _option_node(group: str, option: str, search: Sequence[Path]) -> DictConfig | None:
    """The YAML of ``group/option`` first found on the search path (None: not found or
    unreadable; Hydra reports that when it composes)."""
    for d in search:
        path = d / group / f"{option}.yaml"
        if path.is_file():
            try:
                node = OmegaConf.load(path)
            except Exception:
                return None
            return node if isinstance(node, DictConfig) else None
    return None


def _option_value(group: str, option: str, key: str, search: Sequence[Path]) -> str | None:
    node = _option_node(group, option, search)
    value = node.get(key) if node is not None else None
    return None if value is None else str(value)


def _option_kind(option: str, search: Sequence[Path]) -> str | None:
    """A model option's kind: its ``kind`` key, or the ``<kind>_schema`` it extends."""
    node = _option_node("model", option, search)
    if node is None:
        return None
    if "kind" in node:
        return str(node["kind"])
    defaults = [str(x) for x in node.get("defaults") or []]
    return next((x[: -len("_schema")] for x in defaults if x.endswith("_schema")), None)
