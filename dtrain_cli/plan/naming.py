"""What names a run, and which defaults a run without a recipe trains with. Torch-free.

    dtrain launch model=custom model._target_=my_models.net.Net   # runs/Net-<time>/
    dtrain plan model=hf model.model_type=gpt2                    # "gpt2", gpt_tiny's values

A recipe names its runs. A command line that names none composes the default recipe
(``gpt_tiny``): its steps, batch and LR schedule apply to whatever model is swapped in,
so the run is named after that model and the plan says which of those values apply.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dtrain_cli.config.schema import DtrainConfig

# The default recipe's values that decide a training, as the plan names them
DEFAULTED = (
    ("train.steps", lambda c: c.train.steps),
    ("train.global_batch_size", lambda c: c.train.global_batch_size),
    ("optim.base_lr", lambda c: c.optim.base_lr),
    ("optim.warmup_steps", lambda c: c.optim.warmup_steps),
    ("logging.every", lambda c: c.logging.every),
)


def model_label(cfg: DtrainConfig) -> str:
    """The model's name as a run-dir name: the class (``model=custom``), the model type
    or local folder (``model=hf``), the built-in model's name."""
    from dtrain_cli.models import model_spec

    name = model_spec(cfg).name
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or cfg.model.kind


def borrows_defaults(cfg: DtrainConfig) -> bool:
    """No recipe named, and the model is not the default recipe's own: its values apply to
    another model (a script run has no model)."""
    if cfg.run.recipe_named or cfg.script.path or cfg.script.module:
        return False
    return model_label(cfg) != cfg.run.recipe


def run_label(cfg: DtrainConfig) -> str:
    """What names a run (``<label>-<timestamp>``): the recipe, or the model when the
    run only borrows the default recipe's values."""
    return model_label(cfg) if borrows_defaults(cfg) else cfg.run.recipe


def defaults_note(cfg: DtrainConfig, overrides: Sequence[str]) -> str | None:
    """The plan's line for a run that borrows the default recipe's values (those the
    command line did not set); None otherwise."""
    if not borrows_defaults(cfg):
        return None
    from dtrain_cli.config.overrides import SHORTHANDS

    keys = (ov.lstrip("+~").split("=", 1)[0] for ov in overrides)
    given = {SHORTHANDS.get(k, k) for k in keys}
    values = [f"{key}={get(cfg)}" for key, get in DEFAULTED if key not in given]
    taken = f" ({', '.join(values)})" if values else ""
    return (
        f"no recipe named: model {model_label(cfg)} trains with recipe {cfg.run.recipe}'s "
        f"values{taken}; set them, or name a recipe (dtrain recipes)"
    )
