"""Suggestions in config errors: the closest spelling of a key, a value or a name, and the
key that shares most of a mistyped key's words. Torch-free, standard library only."""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path


def did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate; the same word in other case
    first (``precision=BF16``: difflib, case-sensitive, found nothing)."""
    same = [c for c in candidates if c.lower() == word.lower()]
    close = same or difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def did_you_mean_key(key: str, known: Sequence[str]) -> str:
    """As :func:`did_you_mean`, and also the key of *another section* that shares the most
    of its words (weighted by length), for a key put in the wrong section:
    ``train.checkpoint_every`` names ``train.eval_every`` (spelling) and
    ``checkpoint.every_steps`` (words)."""
    bare = key.lstrip("+~")
    close = difflib.get_close_matches(bare, list(known), n=1, cutoff=0.6)
    words = set(re.split(r"[._]", bare))
    section = bare.split(".")[0]

    def shared(candidate: str) -> float:
        theirs = set(re.split(r"[._]", candidate))
        union = sum(map(len, words | theirs))
        return sum(map(len, words & theirs)) / union if union else 0.0

    leaf = bare.split(".")[-1]
    meant = OTHER_NAMES.get(leaf.lower(), (leaf,))
    same_leaf = [k for k in known if "." in k and k.split(".")[-1] in meant and k != bare]
    same_leaf.sort(key=lambda k: k.split(".")[0] != section)  # its own section's first
    # parallel.steps: train.steps, not parallel.tp; optim.lr: optim.base_lr; seed: train.seed
    if same_leaf and ("." in bare or leaf.lower() in OTHER_NAMES or len(same_leaf) == 1):
        return f" (did you mean {' or '.join(map(repr, same_leaf[:2]))}?)"
    elsewhere = [k for k in known if k.split(".")[0] != section and k not in close]
    best = max(elsewhere, key=shared, default=None)
    names = [*close, *([best] if best is not None and shared(best) >= 0.5 else [])]
    return f" (did you mean {' or '.join(map(repr, names))}?)" if names else ""


OTHER_NAMES = {
    "lr": ("base_lr",),
    "learning_rate": ("base_lr",),
    "max_steps": ("steps",),
    "max_iters": ("steps",),
    "num_steps": ("steps",),
    "total_steps": ("steps",),
    "clip_grad": ("grad_clip",),
    "max_grad_norm": ("grad_clip",),
    "gradient_clipping": ("grad_clip",),
    "betas": ("beta1", "beta2"),
    "batch_size": ("global_batch_size", "micro_batch_size"),
    "gradient_accumulation_steps": ("grad_accum",),
    "accumulate_grad_batches": ("grad_accum",),
    "warmup_iters": ("warmup_steps",),
    "nodes": ("nnodes",),  # dtrain sbatch's and dtrain k8s's shorthand
    "num_nodes": ("nnodes",),
}
"""What other trainers call a key (Hugging Face's TrainingArguments, Lightning, nanoGPT)
-> its leaf here: ``optim.lr`` names ``optim.base_lr``, not the nearest spelling
``optim.min_lr``; ``train.max_steps`` names ``train.steps``, not ``train.max_skips``."""


def not_allowed(key: str, value: object, choices: Sequence[str]) -> str:
    """``key=value: not allowed (did you mean 'x'?); choose one of a, b, c``."""
    hint = did_you_mean(str(value), [str(c) for c in choices])
    return f"{key}={value}: not allowed{hint}; choose one of {', '.join(map(str, choices))}"


SELECTORS = ("strategy", "mode", "source", "schedule")
"""The key of a section that picks its kind: ``sync=diloco`` meant ``sync.mode=diloco``.
Not ``name``: ``cluster.name``, ``model.name`` and ``hardware.name`` are labels (and the
``name`` keys that pick a kind, ``optim.name`` and ``precision.name``, are groups' own)."""


def selector_hint(
    group: str, option: str, keys: Collection[str], choices: Mapping[str, Sequence[str]]
) -> str:
    """`` (or the key sync.mode=diloco?)`` for a config group given an option it lacks, where
    the section has a key that picks its kind (``keys``: every schema key) and ``option``
    may be one of its values (``choices``: the fixed ones, where it has them; registered
    strategies and sync modes are checked with the plan)."""
    key = next((f"{group}.{k}" for k in SELECTORS if f"{group}.{k}" in keys), None)
    if key is None or option not in choices.get(key, (option,)):
        return ""
    return f" (or the key {key}={option}?)"


def recipe_path_hint(recipe: str) -> str:
    """A recipe given as the path of a YAML file of one's own: its name and its folder."""
    path = Path(recipe).expanduser()
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return ""
    folder = path.parent.parent if path.parent.name == "recipes" else path.parent
    return f" (a recipe is named, its folder given: recipe={path.stem} --config-dir {folder})"


def unquoted_keys_hint(key: str, value_text: str) -> str:
    """A dict written with quoted keys (JSON's, Python's), which Hydra's override grammar
    refuses: the same dict with its keys unquoted, to copy."""
    if not re.match(r"""^\{\s*["']""", value_text):
        return ""
    unquoted = re.sub(r"""["']([^"']+)["']\s*:""", r"\1:", value_text)
    return f"a dict's keys go unquoted: '{key}={unquoted}'"


def script_given(token: str) -> str | None:
    """A script's path where overrides are read (``dtrain launch -- train.py``, ``dtrain
    simulate``): the commands that run a script of one's own, for it."""
    if not token.endswith(".py") or "=" in token or token.startswith(("-", "~", "+")):
        return None
    return (
        f"a script of your own runs with dtrain run [OVERRIDES] -- {token} (dtrain plan and "
        "dtrain sbatch take it too); this command runs dtrain's own trainer"
    )


def sweep_hint(key: str, value_text: str, base: str | None) -> str:
    """A comma list given one key: a value with commas (quoted) for a text key (``base``: its
    schema type; None for an open key); for the layout's sizes, the command that sweeps them."""
    if key in ("parallel.dp", "parallel.tp", "parallel.pp", "parallel.nnodes"):
        return f"dtrain simulate sweeps it (dtrain simulate {key}={value_text}) or write one value"
    if base in (None, "str"):
        return f"write one value, or quote one that has commas: {key}='{value_text}'"
    return "write one value (a sweep is not supported)"
