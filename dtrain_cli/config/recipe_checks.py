"""What a recipe file of one's own can get wrong that Hydra reports as a traceback or a bare
line: no ``defaults`` list on the base config, an interpolation that does not resolve, YAML
that does not parse. Each as one line naming the file (``dtrain plan recipe=NAME
--config-dir DIR``). Torch-free."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dtrain_cli.config.overrides import unknown_key
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.search import group_options, list_recipes
from dtrain_cli.config.suggest import did_you_mean

if TYPE_CHECKING:
    from omegaconf import DictConfig


def recipe_problems(cfg: DictConfig, recipe_path: Path) -> list[str]:
    """The composed recipe is dtrain's config (it extends ``base``) and its values resolve."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # composed without the schema (a run's config.yaml copied as it is, a recipe without
    # defaults): every later check would trip on it
    if "run" not in cfg or OmegaConf.get_type(cfg) is not DtrainConfig:
        return [
            f"recipe {recipe_path}: not built on dtrain's base config; begin it with "
            "'defaults: [base, _self_]' (a run's config.yaml too: docs/configuration.md)"
        ]
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "a value"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [f"{key}: {first} (in recipe {recipe_path})"]
    return []


def yaml_error_text(exc: BaseException) -> str | None:
    """A YAML syntax error in a recipe or group file: where (file, line, column) and what,
    from the first ``MarkedYAMLError`` in the chain; None for any other error."""
    import yaml

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, yaml.MarkedYAMLError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    mark = cause.problem_mark or cause.context_mark
    where = f"{mark.name} line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    said = " ".join(x for x in (cause.context, cause.problem) if x)
    return f"{where}{said or type(cause).__name__} (YAML)"


def all_keys(node: type = DtrainConfig, prefix: str = "") -> list[str]:
    """Every key of the schema; under ``model`` the fields of every built-in model kind."""
    from dtrain_cli.models import schema_classes

    keys = []
    for f in fields(node):
        key = f"{prefix}{f.name}"
        keys.append(key)
        if key == "model":
            names = {n.name for cls in schema_classes().values() for n in fields(cls)}
            keys += [f"model.{n}" for n in sorted(names)] + ["model._target_"]
            continue
        t = f.default_factory() if callable(f.default_factory) else None  # type: ignore[misc]
        if t is not None and is_dataclass(t):
            keys += all_keys(type(t), key + ".")
    return keys


def explain_compose_error(
    exc: Exception,
    overrides: Sequence[str],
    config_dirs: Sequence[str | Path] = (),
    recipe: Path | None = None,
) -> str:
    """Hydra's errors (overrides are checked before, so mostly a recipe or group file's
    content) as one line naming the key; a group option missing from a defaults list names
    the options of every config folder (``config_dirs``) and the ``recipe`` composed."""
    chain, cause = [], exc
    while cause is not None and len(chain) < 5:
        chain.append(str(cause).strip())
        cause = cause.__cause__ or cause.__context__
    msg = "\n".join(chain)
    first = chain[0].splitlines()[0] if chain and chain[0] else type(exc).__name__
    m = re.search(r"Key '([^']+)' not in '?\w*'?", msg)
    full_key = re.search(r"full_key: ([\w.]+)", msg)
    if m and "not in" in msg:
        key = full_key.group(1) if full_key else m.group(1)
        if key not in all_keys():
            return unknown_key(key)
    m = re.search(
        r"Value '([^']*)' (?:of type '\w+' )?(?:could not be converted to|is not a valid) (\w+)",
        msg,
    )
    if m:
        where = full_key.group(1) if full_key else "a key"
        kind = {"Integer": "integer", "Float": "number", "Boolean": "boolean (true/false)"}
        return f"{where}: value {m.group(1)!r} is not a valid {kind.get(m.group(2), m.group(2))}"
    m = re.search(r"Invalid value assigned: \w+ is not a (ListConfig|DictConfig)", msg)
    if m:
        where = full_key.group(1) if full_key else "a key"
        want = "[a, b]" if m.group(1) == "ListConfig" else "{key: value}"
        kind = "a list" if m.group(1) == "ListConfig" else "a mapping"
        in_recipe = f" (in {recipe})" if recipe is not None else ""
        return f"{where}{in_recipe}: one value where {kind} is wanted; write {want}"
    m = re.search(r"Merge error: \w+ is not a subclass of (\w+?)Config\. value: (\S+)", msg)
    if m:  # `parallel: fsdp` in a recipe: a section given an option's name
        section, value = m.group(1).lower(), m.group(2)
        in_recipe = f" (in {recipe})" if recipe is not None else ""
        return (
            f"{section}: {value}{in_recipe}: {section} is a section of keys; choose its option "
            f"in the defaults list (- override {section}: {value}) or as {section}={value}"
        )
    m = re.search(r"Could not find '([^']+)/([^']+)'", msg)
    if m:
        group, option = m.group(1).strip("/"), m.group(2)
        opts = group_options(config_dirs).get(group, [])
        where = f" (a defaults list, composing {recipe})" if recipe is not None else ""
        return (
            f"{group}={option}{where}: no such option{did_you_mean(option, opts)}; "
            f"allowed: {', '.join(opts)}"
        )
    m = re.search(r"In '([^']+)': Could not load '([^']+)'", msg)
    if m and (found := list_recipes(config_dirs).get(m.group(2).rsplit("/", 1)[-1])):
        return (  # a recipe is a whole run's config, composed alone: it extends none
            f"{first} '{m.group(2)}' is a recipe, and a recipe's defaults list takes config "
            f"groups only (base, override model: ...); start yours from a copy of {found}"
        )
    if first.endswith(":"):  # Hydra's first line announces what its next ones say
        rest = [ln.strip() for c in chain for ln in c.splitlines()[1:] if ln.strip()]
        said = "; ".join(
            ln for ln in rest[:3] if not ln.startswith(("reference_type", "object_type"))
        )
        return f"{first} {said}" if said else first
    return first


OPEN_SECTIONS = ("model", "data", "hydra")
"""A model kind's or a custom dataset's own keys: checked when composed, not here."""


def recipe_key_problems(recipe_path: Path) -> list[str]:
    """Every key of the recipe file's own body that the schema lacks, and every value not
    among a key's choices, each naming the file: Hydra stops at the first (its line named
    no file), where the command line's mistakes are all told together."""
    import yaml

    from dtrain_cli.config.suggest import not_allowed
    from dtrain_cli.config.validate import CHOICES

    try:
        body = yaml.safe_load(recipe_path.read_text())
    except (OSError, yaml.YAMLError):
        return []
    known = set(all_keys())
    sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
    out: list[str] = []

    def walk(node: dict, prefix: str) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            if key == "defaults" or key.split(".")[0] in OPEN_SECTIONS:
                continue
            if key in sections and isinstance(value, dict):
                walk(value, key + ".")
            elif key not in known:
                out.append(f"{unknown_key(key)} (in recipe {recipe_path})")
            elif key in CHOICES and value not in CHOICES[key] and "${" not in str(value):
                out.append(f"{not_allowed(key, value, CHOICES[key])} (in recipe {recipe_path})")

    if isinstance(body, dict):
        walk(body, "")
    return out


def group_choice_warnings(
    recipe: str, overrides: Sequence[str], config_dirs: Sequence[str | Path] = ()
) -> list[str]:
    """``optim=sgd`` over a recipe that sets ``optim.base_lr`` itself: the recipe's value
    stays over the option's (Hydra merges the recipe after its defaults), so SGD ran at
    AdamW's learning rate without a word (a new user's find)."""
    chosen = [ov.split("=", 1) for ov in overrides if "=" in ov and "." not in ov.split("=")[0]]
    if not chosen:  # nothing read (a plan from the composition cache loads no YAML)
        return []
    groups = set(group_options(config_dirs))
    chosen = [(g.lstrip("+"), o) for g, o in chosen if g.lstrip("+") in groups]
    path = list_recipes(config_dirs).get(recipe) if chosen else None
    if path is None:
        return []
    import yaml

    try:
        body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    given = {ov.split("=", 1)[0].lstrip("+~") for ov in overrides}
    out = []
    for group, option in chosen:
        own = body.get(group) if isinstance(body, dict) else None
        kept = [
            f"{group}.{k}={v}"
            for k, v in (own.items() if isinstance(own, dict) else [])
            if k != "name" and f"{group}.{k}" not in given
        ]
        if kept:
            out.append(
                f"{group}={option}: recipe {recipe} sets {', '.join(kept[:4])}"
                f"{' ...' if len(kept) > 4 else ''} itself, which stay over {option}'s own "
                "values; give them on the command line to change them"
            )
    return out
