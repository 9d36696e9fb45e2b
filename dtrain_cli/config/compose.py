"""Compose a recipe + config groups + overrides into a typed :class:`DtrainConfig`.

    dtrain plan recipe=gpt_small dp=2 optim.base_lr=3e-4

Hydra does the composition (``initialize_config_dir`` + ``compose``); the built-in
``recipes/`` folder is the primary config dir and ``configs/`` plus any user folders
(``--config-dir`` or ``$DTRAIN_CONFIG_PATH``) are on Hydra's search path. A user folder
is laid out like the project: group folders (``model/``, ``data/`` ...) and a
``recipes/`` folder. Errors come back as :class:`ConfigError` with one line per problem.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dtrain_cli.config import compose_cache
from dtrain_cli.config.apply_overrides import apply_values
from dtrain_cli.config.overrides import (
    SHORTHANDS,
    Override,
    check_overrides,
    schema_fields,
)
from dtrain_cli.config.recipe_checks import (
    all_keys,
    explain_compose_error,
    recipe_key_problems,
    recipe_problems,
    yaml_error_text,
)
from dtrain_cli.config.schema import SCHEMA_NAME, DataConfig, DtrainConfig
from dtrain_cli.config.search import (
    group_options,
    list_recipes,
    reserved_problems,
    search_path,
)
from dtrain_cli.config.suggest import did_you_mean, recipe_path_hint
from dtrain_cli.errors import ConfigError
from dtrain_cli.targets import import_roots

if TYPE_CHECKING:
    from omegaconf import DictConfig

# OmegaConf and Hydra are imported where a composition needs them: a repeated command reads
# its typed config back from the cache without them (compose_cache.py)


def expand_shorthands(overrides: Sequence[str]) -> list[str]:
    """Map shorthands to full keys. Every key exists in the typed schema, so Hydra's
    ``+key=v``/``++key=v`` (add) mean set, and ``~key`` (delete) means unset (null)."""
    leaves = {k for k in all_keys() if "." in k}
    out = []
    for ov in overrides:
        m = re.match(r"^([+~]{0,2})([A-Za-z_][\w.]*)(=.*)?$", ov)
        if not m:
            out.append(ov)
            continue
        prefix, key, value = m.group(1), SHORTHANDS.get(m.group(2), m.group(2)), m.group(3) or ""
        if key in leaves and prefix == "~":
            out.append(f"{key}=null")
        elif key in leaves and prefix in ("+", "++"):
            out.append(f"{key}{value}")
        else:
            out.append(f"{prefix}{key}{value}")
    return out


class DefaultRecipe(str):
    """The recipe composed when the command line names none: a str that remembers it."""


def split_recipe(overrides: Sequence[str], default: str = "gpt_tiny") -> tuple[str, list[str]]:
    """(the recipe named by ``recipe=``, or :class:`DefaultRecipe` of ``default``; the rest)."""
    recipe, rest = DefaultRecipe(default), []
    given = [ov for ov in overrides if ov.lstrip("+").startswith("recipe=")]
    if len({Path(g.split("=", 1)[1]).stem for g in given}) > 1:  # the last was taken, silently
        raise ConfigError([f"{' '.join(given)}: one recipe per command; keep the one you mean"])
    for ov in overrides:
        if ov.lstrip("+").startswith("recipe="):  # +recipe= means the same, as for keys
            recipe = ov.split("=", 1)[1]
        else:
            rest.append(ov)
    return recipe, rest


def compose_config(
    recipe: str,
    overrides: Sequence[str] = (),
    config_dirs: Sequence[str | Path] = (),
    validate: bool = True,
) -> DtrainConfig:
    """Compose and (unless the caller validates with the plan) check values. Raises
    ConfigError naming every problem found; when only some overrides were wrong, the error
    carries the config composed without them (``exc.config``) so that the caller can add
    the other problems (root causes, all of them). A composition made before from the same
    inputs is read back typed (no OmegaConf import, compose_cache.py)."""
    from dtrain_cli.config.validate import config_problems

    with compose_cache.one_reading():  # the keys below stat the same files once
        key = _typed_key(recipe, overrides, config_dirs)
        typed = compose_cache.load_typed(key)
        if typed is None:
            try:
                cfg = compose_dictconfig(recipe, overrides, config_dirs)
                typed = to_dataclass(cfg)
            except ConfigError as exc:
                if validate and exc.config is not None:
                    raise ConfigError(exc.problems + config_problems(exc.config)) from None
                raise
            if not compose_cache.interpolates(cfg):  # kept resolved, would not follow $ENV
                compose_cache.store_typed(key, typed)
    if validate and (problems := config_problems(typed)):
        raise ConfigError(problems)
    return typed


def _typed_key(
    recipe: str, overrides: Sequence[str], config_dirs: Sequence[str | Path]
) -> str | None:
    """The typed entry's key: the composition's inputs and what is set on it after
    (the recipe's name, whether one was named, where ``_target_`` modules import from)."""
    recipes = list_recipes(config_dirs)
    if recipe not in recipes:
        return None  # the error is compose_dictconfig's
    set_after = [str(recipe), not isinstance(recipe, DefaultRecipe), import_roots(config_dirs)]
    search = search_path(config_dirs)
    return compose_cache.key_for(recipes[recipe], overrides, search, "typed", set_after)


def compose_dictconfig(
    recipe: str, overrides: Sequence[str] = (), config_dirs: Sequence[str | Path] = ()
) -> DictConfig:
    from omegaconf import OmegaConf

    if shadowed := reserved_problems(config_dirs):
        raise ConfigError(shadowed)
    recipes = list_recipes(config_dirs)
    if recipe not in recipes:
        hint = did_you_mean(Path(recipe).stem, list(recipes)) or recipe_path_hint(recipe)
        raise ConfigError(
            [f"unknown recipe {recipe!r}{hint}; available: {', '.join(recipes) or 'none'}"]
        )
    try:
        recipes[recipe].read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"recipe {recipes[recipe]}: not UTF-8 text (byte {exc.start}); save it as UTF-8"]
        ) from None
    search = search_path(config_dirs)
    key = compose_cache.key_for(recipes[recipe], overrides, search)
    cfg, problems = compose_cache.load(key), []
    if cfg is None:
        cfg, problems = _compose_checked(recipes[recipe], overrides, config_dirs, search)
        if not problems:
            compose_cache.store(key, cfg)
    OmegaConf.update(cfg, "run.recipe", str(recipe), merge=False)
    OmegaConf.update(cfg, "run.recipe_named", not isinstance(recipe, DefaultRecipe), merge=False)
    # where _target_ modules import from, fixed now so every worker and node imports the same
    OmegaConf.update(cfg, "run.import_roots", import_roots(config_dirs), merge=False)
    if problems:
        missing = OmegaConf.missing_keys(cfg)
        raise ConfigError(problems, config=None if missing else to_dataclass(cfg))
    return cfg


def _compose_checked(
    recipe_path: Path,
    overrides: Sequence[str],
    config_dirs: Sequence[str | Path],
    search: Sequence[Path],
) -> tuple[DictConfig, list[str]]:
    """Check the overrides, compose, check what only the composition shows: the config
    (composed without the overrides found wrong) and every problem found."""
    from omegaconf import OmegaConf

    from dtrain_cli.config.kinds import kind_keys

    kind = kind_keys(recipe_path, overrides, search)
    checked, problems = check_overrides(overrides, group_options(config_dirs), **kind)
    cfg = _compose(recipe_path, config_dirs, checked)
    bad = interpolation_problems(cfg, checked, kind["extra"])
    if bad:  # compose again without them, for the other checks
        problems += list(bad.values())
        checked = [ov for ov in checked if ov.key not in bad]
        cfg = _compose(recipe_path, config_dirs, checked)
    missing = sorted(OmegaConf.missing_keys(cfg))
    problems += [f"{k} is required (set {k}=...)" for k in missing]
    return cfg, problems


_COMPOSED: dict[str, DictConfig] = {}


def _compose(recipe_path: Path, config_dirs: Sequence[str | Path], checked: list[Override]):
    """Hydra merges the recipe's defaults list with the group options chosen; values are
    then set on a copy. Hydra's part is kept in this process and in the cache (the same
    recipe, options, files and code compose the same), so a command that changes only
    values does not compose again."""
    import copy

    search = search_path(config_dirs)
    chosen = [f"{ov.key}={ov.value}" for ov in checked if ov.kind == "group"]
    key = compose_cache.key_for(recipe_path, chosen, search, part="groups")
    base = _COMPOSED.get(key) if key is not None else None
    if base is None:
        base = compose_cache.load(key)
        if base is None:
            base = _hydra_compose(recipe_path, search, chosen)
            compose_cache.store(key, base)
        _COMPOSED.clear()  # one entry: a long-lived process composes one recipe at a time
        if key is not None:
            _COMPOSED[key] = base
    cfg = copy.deepcopy(base)
    problems = apply_values(cfg, checked)
    if problems:
        raise ConfigError(problems)
    return cfg


def _hydra_compose(recipe_path: Path, search: list[Path], chosen: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    searchpath = "hydra.searchpath=[" + ",".join(f"file://{p}" for p in search) + "]"
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(recipe_path.parent), version_base="1.3"):
            cfg = compose(config_name=recipe_path.stem, overrides=[searchpath, *chosen])
    except Exception as exc:  # Hydra/OmegaConf raise many types; translate all of them
        told = yaml_error_text(exc)  # else every key the recipe gets wrong, and Hydra's one
        problems = [told] if told else recipe_key_problems(recipe_path)
        explained = explain_compose_error(exc, chosen, search, recipe_path)
        if not told and not any(explained.split(" (")[0] in p for p in problems):
            problems.append(explained)  # what stopped Hydra, unless a line above says it
        raise ConfigError(problems) from None
    finally:
        GlobalHydra.instance().clear()
    if "hydra" in cfg:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    if problems := recipe_problems(cfg, recipe_path):
        raise ConfigError(problems)
    return cfg


def interpolation_problems(
    cfg: DictConfig, checked: Sequence[Override], extra: dict | None = None
) -> dict[str, str]:
    """key -> problem, for each interpolated override that does not resolve, or resolves to
    a value of the wrong type."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    containers = {"list": (list, ListConfig), "dict": (dict, DictConfig)}
    fields_ = {**schema_fields(), **(extra or {})}
    out = {}
    for ov in checked:
        if not (isinstance(ov.value, str) and "${" in ov.value):
            continue
        try:
            value = OmegaConf.select(cfg, ov.key, throw_on_resolution_failure=True)
            want = containers.get(fields_[ov.key].base) if ov.key in fields_ else None
            if want and value is not None and not isinstance(value, want):
                out[ov.key] = (
                    f"{ov.key}={ov.value}: the interpolation gives {value!r}, "
                    f"not a {fields_[ov.key].base}"
                )
        except OmegaConfBaseException as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = why.removeprefix(f"While dereferencing interpolation '{ov.value}': ")
            out[ov.key] = f"{ov.key}={ov.value}: the interpolation fails ({why})"
    return out


def to_dataclass(cfg: DictConfig) -> DtrainConfig:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from dtrain_cli.models import UnknownModelKind, typed_model_config

    _fold_data_kwargs(cfg)
    try:
        obj = OmegaConf.to_object(cfg)
        if not isinstance(obj, DtrainConfig):
            raise ConfigError(
                ["config: not built on dtrain's base config; begin it with 'defaults: [base, "
                 "_self_]'"]
            )  # fmt: skip
        obj.model = typed_model_config(obj.model)
    except OmegaConfBaseException as exc:  # an interpolation in a YAML file, say
        key = getattr(exc, "full_key", None) or "config"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError([f"{key}: {first}"]) from None
    except UnknownModelKind as exc:
        raise ConfigError([str(exc)]) from None
    return obj


def _fold_data_kwargs(cfg: DictConfig) -> None:
    """``data=custom``: extra ``data.*`` keys (``++data.n=100``, or a recipe's) are the
    dataset's keyword arguments; they are copied under ``data.kwargs`` (the typed
    config drops keys it does not declare)."""
    from omegaconf import DictConfig, open_dict

    data = cfg.get("data")
    if not isinstance(data, DictConfig):
        return
    known = {f.name for f in fields(DataConfig)}
    extra = [k for k in data if k not in known]
    if not extra:
        return
    with open_dict(cfg):
        for k in extra:
            data.kwargs[k] = data[k]


def config_from_yaml(path: str | Path) -> DtrainConfig:
    """Read a resolved ``config.yaml`` back into the typed config (workers, resume)."""
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(DtrainConfig)
    return to_dataclass(OmegaConf.merge(schema, OmegaConf.load(path)))


def config_to_yaml(cfg: DtrainConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(config_container(cfg))


def config_container(cfg: DtrainConfig) -> dict:
    """The config as plain data, the model as its kind writes it (``config.yaml``)."""
    from omegaconf import OmegaConf

    from dtrain_cli.models import model_spec

    data = OmegaConf.to_container(OmegaConf.structured(replace(cfg, model=None)))
    assert isinstance(data, dict)
    return {
        "model": model_spec(cfg).config_dict(),
        **{k: v for k, v in data.items() if k != "model"},
    }


def register_schema() -> None:
    """Store the schema so ``configs/base.yaml`` can extend it (``defaults: [dtrain_schema]``)."""
    from hydra.core.config_store import ConfigStore  # here, not at import: keeps --help fast

    from dtrain_cli.models import schema_classes

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=DtrainConfig)
    for name, cls in schema_classes().items():
        store.store(group="model", name=name, node=cls)
