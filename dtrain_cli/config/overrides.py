"""Check command-line overrides against the schema before Hydra sees them.

    dtrain plan recipe=gpt_tiny dp=2 +cluster.env.NCCL_DEBUG=WARN "cluster.env={X:abc}"

Every key exists in the typed schema, so the grammar is small and ours to explain:
``key=value`` sets a value (``+key=value`` and ``++key=value`` mean the same), ``~key``
unsets an optional value (null), ``group=option`` picks a config group option. Each token
is checked on its own (key known, value of the field's type, one value not a sweep) so
that every mistake is reported, one line each, naming the key and the form to write.
Dict fields (``cluster.env``) take a whole dict (``cluster.env={X:abc}``, replacing it)
or one entry (``cluster.env.X=abc``); both are applied after composition.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

from dtrain_cli.config import suggest
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.search import list_recipes
from dtrain_cli.config.suggest import did_you_mean, did_you_mean_key, selector_hint, sweep_hint

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
TOKEN_RE = re.compile(r"^(~|\+\+?)?([A-Za-z_][\w.]*)(=.*)?$", re.DOTALL)
FORMS = "overrides look like key=value, +key=value, ~key or group=option"
KIND = {"int": "an integer", "float": "a number", "bool": "a boolean", "str": "a string"}
EXAMPLE = {"int": "8", "float": "0.1", "bool": "true", "str": "NAME"}


@dataclass(frozen=True, kw_only=True)
class Field:
    """A leaf of the schema: its type as written (``int | None``) and its default."""

    key: str
    type: str
    default: Any

    @property
    def optional(self) -> bool:
        return "None" in self.type

    @property
    def base(self) -> str:
        return self.type.replace("| None", "").strip().split("[")[0]

    def example(self) -> str:
        if self.default is not None and self.base in EXAMPLE:
            value = self.default
            return str(value).lower() if isinstance(value, bool) else str(value)
        return {"list": "[8,16]", "dict": "{KEY:value}"}.get(self.base, EXAMPLE.get(self.base, "X"))


@dataclass(frozen=True, kw_only=True)
class Override:
    """One checked override: a group option (``kind="group"``, composed by Hydra), a
    value (``"value"``) or a dict field or entry (``"dict"``), set on the composed config."""

    text: str
    key: str
    value: Any
    kind: str


def schema_fields(node: type = DtrainConfig, prefix: str = "") -> dict[str, Field]:
    out: dict[str, Field] = {}
    for f in fields(node):
        key = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if is_dataclass(default):
            out.update(schema_fields(type(default), key + "."))
        else:
            out[key] = Field(key=key, type=str(f.type), default=default)
    return out


def sections() -> list[str]:
    return [f.name for f in fields(DtrainConfig)]


REMOVED_KEYS = {
    "launcher.collective_timeout_s": (
        "removed: debug.collective_timeout_s is the one collective timeout (the process "
        "group waits 15 s longer; debug.hang_watchdog=false leaves it to the process group)"
    ),
    "model.sync_bn": (
        "moved: parallel.sync_batchnorm=true synchronizes the BatchNorm layers of any model "
        "over the dp group"
    ),
}
"""Keys that existed once -> what replaces them (one line, no 'did you mean')."""


def unknown_key(key: str) -> str:
    if key.lstrip("+~") in REMOVED_KEYS:
        return f"{key.lstrip('+~')}: {REMOVED_KEYS[key.lstrip('+~')]}"
    known = [*schema_fields(), *SHORTHANDS]
    return (
        f"unknown key {key!r}{did_you_mean_key(key, known)}; "
        "see `dtrain plan --show-config` for all keys"
    )


def check_overrides(
    tokens: Sequence[str],
    groups: Mapping[str, Sequence[str]],
    extra: Mapping[str, Field] | None = None,
    open_prefixes: Sequence[str] = (),
    model_label: str | None = None,
) -> tuple[list[Override], list[str]]:
    """The overrides that are fine, and one problem line for each that is not. ``extra``:
    the chosen model kind's keys (``model.*``); keys under ``open_prefixes`` take any value
    (a custom model's keyword arguments); ``model_label`` names the model in errors."""
    checker = _Checker(groups, extra or {}, open_prefixes, model_label)
    i = 0
    while i < len(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        i += 1 + checker.check(tokens[i], nxt)
    return checker.good, checker.problems


class _Checker:
    """Checks one token at a time (a flag-like token may take the next one with it)."""

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        extra: Mapping[str, Field],
        open_prefixes: Sequence[str],
        model_label: str | None,
    ) -> None:
        self.groups, self.extra, self.open_prefixes = groups, extra, open_prefixes
        self.model_label = model_label
        self.known = {**schema_fields(), **extra}
        self.scratch_model = _model_scratch(extra) if extra else None
        self.good: list[Override] = []
        self.problems: list[str] = []

    def check(self, tok: str, nxt: str | None) -> int:
        """Check ``tok``; returns how many of the following tokens it used (0, 1, or all)."""
        if said := suggest.script_given(tok):  # what follows is the script's own arguments
            self.problems.append(f"{tok!r}: {said}")
            return 1 << 30
        m = TOKEN_RE.match(tok)
        taken = nxt is not None and "=" not in nxt and not nxt.startswith(("-", "~", "+"))
        if tok.startswith("-"):
            pair = taken and "=" not in tok
            self.problems.append(_dashed(f"{tok}={nxt}" if pair else tok, self.known, tok))
            return int(pair)
        first, _, second = tok.partition(" ")
        if m is None and SHORTHANDS.get(first, first) in self.known and "=" not in first:
            value = second.strip().removeprefix("=").strip()  # 'key = value' and 'key value'
            self.problems.append(f"{tok!r}: write {first}={value} (no spaces around '=')")
            return 0
        if m is None:
            where = "no key before '='" if tok.startswith("=") else "not an override"
            self.problems.append(f"{tok!r}: {where}; {FORMS}")
            return 0
        prefix, name, rest = m.group(1) or "", m.group(2), m.group(3)
        if rest is None and prefix != "~":
            if taken:
                self.problems.append(f"'{tok} {nxt}': write {name}={nxt} (no spaces around '=')")
            elif name in list_recipes():  # the built-in ones
                self.problems.append(f"{tok!r}: a recipe; write recipe={name}")
            else:
                self.problems.append(f"{tok!r}: no value; write {name}=VALUE ({FORMS})")
            return int(taken)
        self.value(tok, prefix, SHORTHANDS.get(name, name), (rest or "=")[1:])
        return 0

    def value(self, tok: str, prefix: str, key: str, value_text: str) -> None:
        """A ``key=value`` override: a group option, an open key, a dict, or a value."""
        if key in REMOVED_KEYS:  # before a custom model's open keys take it as an argument
            self.problems.append(unknown_key(key))
            return
        if key in self.groups:
            self.problems += _group(key, prefix, value_text, self.groups[key], self.good, tok)
            return
        opened = any(key.startswith(p) or key == p.rstrip(".") for p in self.open_prefixes)
        if key not in self.known and opened:
            parsed, problem = _parse(key, value_text, prefix == "~")
            if problem:
                self.problems.append(problem)
            else:
                kind = "delete" if prefix == "~" else "open"  # ~model.config.X: the entry
                self.good.append(Override(text=tok, key=key, value=parsed, kind=kind))
            return
        dict_field = next(
            (
                f
                for f in self.known.values()
                if f.base == "dict" and (key == f.key or key.startswith(f.key + "."))
            ),
            None,
        )
        if key not in self.known and dict_field is None:
            self.problems.append(self.unknown(key))
            return
        if key == "parallel.nnodes" and ":" in value_text:  # elastic: nnodes=MIN:MAX
            self.problems += _node_range(tok, value_text, self.good)
            return
        base = self.known[key].base if key in self.known else None
        parsed, problem = _parse(key, value_text, prefix == "~", base)
        if problem is None and dict_field is not None:
            self.problems += _dict(dict_field, key, parsed, self.good, tok)
            return
        if problem is None:
            scratch = self.scratch_model if key.startswith("model.") else None
            problem = _type_problem(self.known[key], parsed, scratch or _scratch())
        if problem:
            self.problems.append(problem)
        else:
            self.good.append(Override(text=tok, key=key, value=parsed, kind="value"))

    def unknown(self, key: str) -> str:
        """A key no schema has: the model's keys, data's, or the whole schema's."""
        if key.startswith("model.") and self.model_label:
            names = [k.removeprefix("model.") for k in self.extra]
            hint = did_you_mean(key.removeprefix("model."), names)
            return f"{key}: not a key of {self.model_label}{hint}; its keys: {', '.join(names)}"
        if key.startswith("data."):
            names = [k for k in self.known if k.startswith("data.")]
            return (
                f"{key}: not a key of data{did_you_mean(key, names)}; only data=custom "
                "takes extra keys (its dataset's keyword arguments)"
            )
        return unknown_key(key)


def _node_range(tok: str, value_text: str, good: list[Override]) -> list[str]:
    """``nnodes=MIN:MAX`` -> parallel.min_nnodes and parallel.nnodes (ordered: validate.py)."""
    low, _, high = value_text.partition(":")
    if not (low.strip().lstrip("-").isdigit() and high.strip().isdigit()):
        return [f"{tok}: expected MIN:MAX node counts, e.g. parallel.nnodes=1:4"]
    good.append(Override(text=tok, key="parallel.min_nnodes", value=int(low), kind="value"))
    good.append(Override(text=tok, key="parallel.nnodes", value=int(high), kind="value"))
    return []


def _dashed(text: str, known: Mapping[str, Field], tok: str) -> str:
    """``--dp=2``, ``--train.steps 5``: an override typed as an option."""
    body = text.lstrip("-")
    name = body.split("=", 1)[0].replace("-", "_")
    key = SHORTHANDS.get(name, name)
    if key in known or key in sections():
        value = body.split("=", 1)[1] if "=" in body else "VALUE"
        shown = text.replace("=", " ", 1) if text != tok else tok
        return f"{shown!r}: overrides take no dashes; write {name}={value}"
    return f"{tok!r}: not an option of this command (see --help); {FORMS}"


def _parse(key: str, text: str, delete: bool, base: str | None = None) -> tuple[Any, str | None]:
    """``base``: the schema field's type, where the key has one (None: open keys)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if delete:
        return None, None
    try:
        ov = OverridesParser.create().parse_override(f"{key}={text}")
    except Exception as exc:  # Hydra's grammar errors: several types, first line says where
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if hint := suggest.unquoted_keys_hint(key, text):  # JSON's or Python's quoted keys
            return None, f"{key}={text}: cannot parse the value ({why}); {hint}"
        return None, (f"{key}={text}: cannot parse the value ({why}); quote it: {key}='...'")
    if ov.is_sweep_override():
        return None, f"{key}={text}: one value per key; " + sweep_hint(key, text, base)
    return ov.value(), None


_SCRATCH: list[Any] = []


def _scratch() -> Any:
    """One typed copy of the schema per process, only written to (type checks): building
    it costs more than everything else a plan does."""
    if not _SCRATCH:
        from omegaconf import OmegaConf

        _SCRATCH.append(OmegaConf.structured(DtrainConfig))
    return _SCRATCH[0]


def _model_scratch(extra: Mapping[str, Field]) -> Any:
    """A typed scratch copy of the chosen model kind's config, under ``model``."""
    from omegaconf import OmegaConf

    from dtrain_cli.models import KINDS, spec_class

    kinds = [f.default for k, f in extra.items() if k == "model.kind"]
    if not kinds or kinds[0] not in KINDS:
        return None
    return OmegaConf.create({"model": OmegaConf.structured(spec_class(kinds[0]).config_class)})


def _type_problem(f: Field, value: Any, scratch: Any) -> str | None:
    """None if ``value`` fits the field: OmegaConf's own conversion rules decide, on a
    scratch copy of the schema."""
    if value is None:
        if f.optional:
            return None
        return (
            f"{f.key}: cannot be unset (it has no null value); set it, e.g. {f.key}={f.example()}"
        )
    if isinstance(value, str) and "${" in value:
        return None  # an interpolation: checked once the config it refers to is composed
    from omegaconf import OmegaConf

    try:
        OmegaConf.update(scratch, f.key, value, merge=False)
    except Exception:  # ValidationError & co: the value does not fit the field's type
        kind = KIND.get(f.base, f"a {f.base}")
        hint = f"{f.key}=true or {f.key}=false" if f.base == "bool" else f"{f.key}={f.example()}"
        return f"{f.key}: value {value!r} is not {kind}; write e.g. {hint}"
    return None


def _group(
    group: str,
    prefix: str,
    option: str,
    options: Sequence[str],
    good: list[Override],
    tok: str,
) -> list[str]:
    if prefix == "~":
        return [f"~{group}: a config group cannot be unset; choose one of {', '.join(options)}"]
    if option not in options:
        from dtrain_cli.config.validate import CHOICES

        close = did_you_mean(option, options)  # a typo of an option: not the key's value
        plain = "" if close else selector_hint(group, option, schema_fields(), CHOICES)
        return [f"{group}={option}: no such option{close}; allowed: {', '.join(options)}{plain}"]
    good.append(Override(text=tok, key=group, value=option, kind="group"))
    return []


def _dict(f: Field, key: str, value: Any, good: list[Override], tok: str) -> list[str]:
    """``cluster.env={X:abc}`` (the whole dict, replacing it) or ``cluster.env.X=abc``."""
    entry = f"write {f.key}={{NAME:value}} or set one entry: +{f.key}.NAME=value"
    text = f.type.endswith("str]")  # cluster.env, parallel.tp_plan; not model.config's values
    if key == f.key:
        value = {} if value is None else value
        if not isinstance(value, dict):
            return [f"{key}: value {value!r} is not a dict; {entry}"]
        if text and any(isinstance(v, (dict, list)) or v is None for v in value.values()):
            return [f"{key}={tok.split('=', 1)[1]}: values must be strings; {entry}"]
        value = {str(k): str(v) if text else v for k, v in value.items()}
    elif not text:
        pass
    elif isinstance(value, (dict, list)):
        return [f"{key}: value {value!r} is not a string; write e.g. {key}=value"]
    elif value is not None:
        value = str(value).lower() if isinstance(value, bool) else str(value)
    good.append(Override(text=tok, key=key, value=value, kind="dict"))
    return []
