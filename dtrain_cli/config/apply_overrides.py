"""The checked overrides (:mod:`.overrides`) set on the composed config, in the order given:
what Hydra does after merging the defaults list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dtrain_cli.config.overrides import Override


def apply_values(cfg: Any, overrides: Sequence[Override]) -> list[str]:
    """Set values and dict fields on the composed config, in the order given (what Hydra
    does after merging the defaults list): a whole dict replaces, an entry sets or
    removes. Returns a problem line for each that does not fit."""
    from omegaconf import OmegaConf, open_dict

    problems = []
    for ov in overrides:
        parent_key, _, entry = ov.key.rpartition(".")
        try:
            if ov.kind == "value":
                OmegaConf.update(cfg, ov.key, ov.value, merge=True)
                continue
            if ov.kind == "open":  # keys the schema cannot know (keyword arguments)
                OmegaConf.update(cfg, ov.key, ov.value, merge=True, force_add=True)
                continue
            if ov.kind not in ("dict", "delete"):
                continue
            with open_dict(cfg):
                if isinstance(ov.value, dict):
                    OmegaConf.update(cfg, ov.key, {}, merge=False)
                    OmegaConf.update(cfg, ov.key, ov.value, merge=True)
                elif ov.value is None and not isinstance(OmegaConf.select(cfg, ov.key), dict):
                    parent = OmegaConf.select(cfg, parent_key)
                    if parent is not None and entry in parent:
                        with open_dict(parent):  # a typed node's own flag (data=custom's)
                            del parent[entry]
                    elif parent is not None and hasattr(parent, "keys"):
                        # ~cluster.env.NCCL_DEBUGG removed nothing and said nothing
                        problems.append(_no_entry(ov.text, parent_key, entry, list(parent)))
                else:
                    OmegaConf.update(cfg, ov.key, ov.value, merge=True)
        except Exception as exc:  # OmegaConf's validation errors: the value does not fit
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            problems.append(f"{ov.text}: {first}")
    return problems


def _no_entry(text: str, parent_key: str, entry: str, entries: list[str]) -> str:
    from dtrain_cli.config.suggest import did_you_mean

    have = ", ".join(map(str, entries)) or "none"
    return (
        f"{text}: {parent_key} has no entry {entry!r} to remove{did_you_mean(entry, entries)}; "
        f"its entries: {have}"
    )
