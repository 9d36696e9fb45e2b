"""What a recipe file of one's own can get wrong that Hydra reports as a traceback or a bare
line: no ``defaults`` list on the base config, an interpolation that does not resolve, YAML
that does not parse. Each as one line naming the file (``dtrain plan recipe=NAME
--config-dir DIR``). Torch-free."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig


def recipe_problems(cfg: DictConfig, recipe_path: Path) -> list[str]:
    """The composed recipe is dtrain's config (it extends ``base``) and its values resolve."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if "run" not in cfg:  # composed without the schema: every later check would trip on it
        return [
            f"recipe {recipe_path}: not built on dtrain's base config; begin it with "
            "'defaults: [base, _self_]' (docs/configuration.md)"
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
