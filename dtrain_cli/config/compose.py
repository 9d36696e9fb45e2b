"""Compose a recipe + config groups + overrides into a typed :class:`DtrainConfig`.

    dtrain plan recipe=gpt_small dp=2 optim.base_lr=3e-4

Hydra does the composition (``initialize_config_dir`` + ``compose``); the built-in
``recipes/`` folder is the primary config dir and ``configs/`` plus any user folders
(``--config-dir`` or ``$DTRAIN_CONFIG_PATH``) are on Hydra's search path. A user folder
is laid out like the project: group folders (``model/``, ``data/`` ...) and a
``recipes/`` folder. Errors come back as :class:`ConfigError` with one line per problem.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from dataclasses import fields, is_dataclass, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from dtrain_cli.config.errors import ConfigError
from dtrain_cli.config.schema import DataConfig, DtrainConfig, register_schema
from dtrain_cli.config.targets import import_roots

CONFIG_PATH_ENV = "DTRAIN_CONFIG_PATH"

# Shorthands users type most; each maps to its full key (group selections such as
# precision=bf16 are already Hydra group overrides and need no mapping).
SHORTHANDS = {
    "dp": "parallel.dp",
    "tp": "parallel.tp",
    "pp": "parallel.pp",
    "lr_scaling": "optim.lr_scaling",
    "lr": "optim.base_lr",
    "steps": "train.steps",
    "nnodes": "parallel.nnodes",
    "nproc_per_node": "parallel.nproc_per_node",
}


def _package_dir(name: str) -> Path:
    """``configs``/``recipes``: inside the wheel (``dtrain_cli/_data``) or at the repo root."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_data" / name, here.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"dtrain's built-in '{name}' folder is missing (looked beside {here})")


def builtin_configs_dir() -> Path:
    return _package_dir("configs")


def builtin_recipes_dir() -> Path:
    return _package_dir("recipes")


def user_config_dirs(extra: Sequence[str | Path] = ()) -> list[Path]:
    dirs = [Path(d) for d in extra]
    dirs += [Path(d) for d in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if d]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise ConfigError([f"config dir {m!r} does not exist" for m in missing])
    return [d.resolve() for d in dirs]


def recipe_dirs(extra: Sequence[str | Path] = ()) -> list[Path]:
    """Where recipes are looked up, first match wins: each user folder's recipes/ and the
    folder itself (``--config-dir conf`` with ``conf/my_experiment.yaml``), then built-in."""
    dirs = []
    for d in user_config_dirs(extra):
        dirs += [d / "recipes"] if (d / "recipes").is_dir() else []
        dirs.append(d)
    return [*dirs, builtin_recipes_dir()]


def list_recipes(extra: Sequence[str | Path] = ()) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in reversed(recipe_dirs(extra)):
        for p in sorted(d.glob("*.yaml")):
            found[p.stem] = p
    return dict(sorted(found.items()))


def recipe_description(path: Path) -> str:
    """The recipe's first header comment that is neither its command nor an example."""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text and not text.startswith(("dtrain ", "e.g.", "@package")):
            return text
    return ""


def expand_shorthands(overrides: Sequence[str]) -> list[str]:
    """Map shorthands to full keys. Every key exists in the typed schema, so Hydra's
    ``+key=v``/``++key=v`` (add) mean set, and ``~key`` (delete) means unset (null)."""
    leaves = {k for k in _all_keys() if "." in k}
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


def split_recipe(overrides: Sequence[str], default: str = "gpt_tiny") -> tuple[str, list[str]]:
    recipe, rest = default, []
    for ov in overrides:
        if ov.startswith("recipe="):
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
    ConfigError naming every problem found."""
    from dtrain_cli.config.validate import validate_config

    typed = to_dataclass(compose_dictconfig(recipe, overrides, config_dirs))
    if validate:
        validate_config(typed)
    return typed


def compose_dictconfig(
    recipe: str, overrides: Sequence[str] = (), config_dirs: Sequence[str | Path] = ()
) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    recipes = list_recipes(config_dirs)
    if recipe not in recipes:
        hint = _did_you_mean(recipe, recipes)
        raise ConfigError(
            [f"unknown recipe {recipe!r}{hint}; available: {', '.join(recipes) or 'none'}"]
        )
    user_dirs = user_config_dirs(config_dirs)
    search = [*user_dirs, *(d / "recipes" for d in user_dirs), builtin_configs_dir()]
    search = [d for d in search if d.is_dir()]
    searchpath = "hydra.searchpath=[" + ",".join(f"file://{p}" for p in search) + "]"
    user_overrides = open_key_overrides(recipes[recipe], expand_shorthands(overrides), search)
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(recipes[recipe].parent), version_base="1.3"):
            cfg = compose(config_name=recipe, overrides=[searchpath, *user_overrides])
    except Exception as exc:  # Hydra/OmegaConf raise many types; translate all of them
        message = _model_key_error(exc, recipes[recipe], user_overrides, search)
        raise ConfigError([message or _explain_compose_error(exc, user_overrides)]) from None
    finally:
        GlobalHydra.instance().clear()
    if "hydra" in cfg:
        with _writable(cfg):
            del cfg["hydra"]
    OmegaConf.update(cfg, "run.recipe", recipe, merge=False)
    # where _target_ modules import from, fixed now so every worker and node imports the same
    OmegaConf.update(cfg, "run.import_roots", import_roots(config_dirs), merge=False)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError([f"{k} is required (set {k}=...)" for k in missing])
    return cfg


class _writable:
    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def __enter__(self) -> None:
        OmegaConf.set_struct(self.cfg, False)

    def __exit__(self, *exc: object) -> None:
        OmegaConf.set_struct(self.cfg, True)


def to_dataclass(cfg: DictConfig) -> DtrainConfig:
    from dtrain_cli.models import typed_model_config

    _fold_data_kwargs(cfg)
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, DtrainConfig)
    obj.model = typed_model_config(obj.model)
    return obj


def _fold_data_kwargs(cfg: DictConfig) -> None:
    """``data=custom``: extra ``data.*`` keys (``++data.n=100``, or a recipe's) are the
    dataset's keyword arguments; they are copied under ``data.kwargs`` (the typed
    config drops keys it does not declare)."""
    data = cfg.get("data")
    if not isinstance(data, DictConfig):
        return
    known = {f.name for f in fields(DataConfig)}
    extra = [k for k in data if k not in known]
    if not extra:
        return
    with _writable(cfg):
        for k in extra:
            data.kwargs[k] = data[k]


def config_from_yaml(path: str | Path) -> DtrainConfig:
    """Read a resolved ``config.yaml`` back into the typed config (workers, resume)."""
    schema = OmegaConf.structured(DtrainConfig)
    return to_dataclass(OmegaConf.merge(schema, OmegaConf.load(path)))


def config_to_yaml(cfg: DtrainConfig) -> str:
    return OmegaConf.to_yaml(config_container(cfg))


def config_container(cfg: DtrainConfig) -> dict:
    """The config as plain data, the model as its kind writes it (``config.yaml``)."""
    from dtrain_cli.models import model_spec

    data = OmegaConf.to_container(OmegaConf.structured(replace(cfg, model=None)))
    assert isinstance(data, dict)
    return {
        "model": model_spec(cfg).config_dict(),
        **{k: v for k, v in data.items() if k != "model"},
    }


def _all_keys(node: type = DtrainConfig, prefix: str = "") -> list[str]:
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
            keys += _all_keys(type(t), key + ".")
    return keys


def open_key_overrides(
    recipe_path: Path, overrides: list[str], search: Sequence[Path]
) -> list[str]:
    """Keys the schema cannot know (a custom model's or dataset's keyword arguments, a
    transformers config) are added, not overridden: ``model.width=256`` becomes
    ``++model.width=256`` when the chosen option is of an open kind
    (``dtrain_cli.models.OPEN_KEYS``; ``data=custom``)."""
    from dtrain_cli.models import OPEN_KEYS

    prefixes = []
    option = _group_option("model", recipe_path, overrides)
    kind = _option_kind(option, search) if option else None
    if kind in OPEN_KEYS:
        prefixes.append(OPEN_KEYS[kind])
    data_option = _group_option("data", recipe_path, overrides)
    if data_option and _option_value("data", data_option, "source", search) == "custom":
        prefixes.append("data.")
    if not prefixes:
        return overrides
    out = []
    for ov in overrides:
        key = ov.split("=", 1)[0]
        if "=" in ov and key.startswith(tuple(prefixes)) and not key.startswith(("+", "~")):
            ov = f"++{ov}"
        out.append(ov)
    return out


def _model_key_error(
    exc: Exception, recipe_path: Path, overrides: Sequence[str], search: Sequence[Path]
) -> str | None:
    """A ``model.<key>`` the chosen model kind does not have: name the kind and its keys."""
    from dtrain_cli.models import UnknownModelKind, spec_class

    m = re.search(r"Could not override '(model\.[\w.]+)'", str(exc))
    option = _group_option("model", recipe_path, overrides)
    kind = _option_kind(option, search) if m and option else None
    if not (m and kind):
        return None
    try:
        names = [f.name for f in fields(spec_class(kind).config_class)]
    except (UnknownModelKind, TypeError):
        return None
    key = m.group(1)
    hint = _did_you_mean(key.split(".", 1)[1], names)
    return f"{key}: not a key of model={option} (kind {kind}){hint}; its keys: {', '.join(names)}"


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


def _option_value(group: str, option: str, key: str, search: Sequence[Path]) -> str | None:
    for d in search:
        path = d / group / f"{option}.yaml"
        if path.is_file():
            try:
                value = OmegaConf.load(path).get(key)
            except Exception:
                return None
            return None if value is None else str(value)
    return None


def _option_kind(option: str, search: Sequence[Path]) -> str | None:
    for d in search:
        path = d / "model" / f"{option}.yaml"
        if path.is_file():
            try:
                node = OmegaConf.load(path)
            except Exception:
                return None
            if "kind" in node:
                return str(node["kind"])
            defaults = [str(x) for x in node.get("defaults") or []]
            return next((x[: -len("_schema")] for x in defaults if x.endswith("_schema")), None)
    return None


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _explain_compose_error(exc: Exception, overrides: Sequence[str]) -> str:
    chain, cause = [], exc
    while cause is not None and len(chain) < 5:
        chain.append(str(cause).strip())
        cause = cause.__cause__ or cause.__context__
    msg = "\n".join(chain)
    first = chain[0].splitlines()[0] if chain and chain[0] else type(exc).__name__
    m = re.search(r"Could not override '([^']+)'", msg) or re.search(
        r"Key '([^']+)' not in '?\w*'?", msg
    )
    if m and ("not in" in msg or "Could not override" in msg):
        key = m.group(1)
        full = next((k for k in _all_keys() if k.endswith("." + key) or k == key), None)
        guess = _did_you_mean(key, _all_keys())
        if full is None:
            return f"unknown key {key!r}{guess}; see `dtrain plan --show-config` for all keys"
    m = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", msg)
    if m:
        key = re.search(r"full_key: ([\w.]+)", msg)
        where = key.group(1) if key else "a key"
        kind = {"Integer": "integer", "Float": "number", "Boolean": "boolean (true/false)"}
        return f"{where}: value {m.group(1)!r} is not a valid {kind.get(m.group(2), m.group(2))}"
    m = re.search(r"Could not find '([^']+)/([^']+)'", msg)
    if m:
        group, option = m.group(1).strip("/"), m.group(2)
        opts = _group_options(group)
        return (
            f"{group}={option}: no such option{_did_you_mean(option, opts)}; "
            f"allowed: {', '.join(opts)}"
        )
    if "mismatched input" in msg or "no viable alternative" in msg:
        return f"cannot parse override ({first}); overrides look like key=value, +key=value, ~key"
    return first


def _group_options(group: str) -> list[str]:
    d = builtin_configs_dir() / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


# Keys a resume may not change: the checkpoint's weights, optimizer state and data stream
# depend on them. Everything else (steps, layout, cadence, logging, LR values) is allowed.
UNSAFE_ON_RESUME = ("model.", "data.", "train.seed", "optim.name", "run.root", "run.name")


def override_config(
    cfg: DtrainConfig, overrides: Sequence[str], config_dirs: Sequence[str | Path] = ()
) -> DtrainConfig:
    """Apply Hydra-grammar overrides to an already resolved config (``dtrain resume``).
    ``group=option`` merges that option's YAML from the search path."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dtrain_cli.config.validate import validate_config

    node = OmegaConf.structured(cfg)
    expanded = expand_shorthands(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(expanded)
    except Exception as exc:
        raise ConfigError([_explain_compose_error(exc, expanded)]) from None
    dirs = [*user_config_dirs(config_dirs), builtin_configs_dir()]
    problems = []
    for ov in parsed:
        key = ov.key_or_group
        try:
            if "." not in key and key in node and ov.value() is not None and not ov.is_delete():
                option = str(ov.value())
                found = next(
                    (
                        d / key / f"{option}.yaml"
                        for d in dirs
                        if (d / key / f"{option}.yaml").is_file()
                    ),
                    None,
                )
                if found is None:
                    opts = _group_options(key)
                    problems.append(
                        f"{key}={option}: no such option"
                        f"{_did_you_mean(option, opts)}; allowed: {', '.join(opts)}"
                    )
                    continue
                node[key] = OmegaConf.merge(node[key], OmegaConf.load(found))
            else:
                OmegaConf.update(node, key, None if ov.is_delete() else ov.value(), merge=True)
        except (ConfigKeyError, ConfigAttributeError):
            problems.append(f"unknown key {key!r}{_did_you_mean(key, _all_keys())}")
        except Exception as exc:
            problems.append(_explain_compose_error(exc, [key]))
    if problems:
        raise ConfigError(problems)
    new = to_dataclass(node)
    validate_config(new)
    return new


def unsafe_resume_changes(old: DtrainConfig, new: DtrainConfig) -> list[str]:
    """One line per key a resume may not change, naming the checkpoint's value."""
    a = _flatten(OmegaConf.to_container(OmegaConf.structured(old)))
    b = _flatten(OmegaConf.to_container(OmegaConf.structured(new)))
    out = []
    for key in sorted(a):
        if a[key] != b.get(key) and key.startswith(UNSAFE_ON_RESUME):
            out.append(
                f"{key}={b.get(key)}: cannot change on resume (the checkpoint has {key}="
                f"{a[key]}); fixed on resume: "
                f"{', '.join(k + '*' if k.endswith('.') else k for k in UNSAFE_ON_RESUME)}"
            )
    return out


def _flatten(d: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, object] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out
