"""What ``dtrain resume`` may change: overrides applied to a checkpoint's resolved config,
checked as composition checks them, and the keys a resume must keep. Torch-free.

    dtrain resume --ckpt runs/<run> train.steps=400 dp=4      # allowed: steps, layout
    dtrain resume --ckpt runs/<run> model.n_layer=8           # exit 2: the weights' shape
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import is_dataclass, replace
from pathlib import Path

from omegaconf import OmegaConf

from dtrain_cli.config.apply_overrides import apply_values
from dtrain_cli.config.compose import interpolation_problems, to_dataclass
from dtrain_cli.config.overrides import check_overrides, schema_fields
from dtrain_cli.config.recipe_checks import explain_compose_error
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.search import builtin_configs_dir, group_options, user_config_dirs
from dtrain_cli.errors import ConfigError
from dtrain_cli.rundir.config_keys import flat_keys

# Keys a resume may not change: the checkpoint's weights, optimizer state and data stream
# depend on them. Everything else (steps, layout, cadence, logging, LR values) is allowed.
UNSAFE_ON_RESUME = (
    "model.",
    "data.",
    "train.seed",
    "optim.name",
    "run.root",
    "run.name",
    "run.recipe",
)
# ... except where batches are read: the loader's workers change no sample
SAFE_ON_RESUME = ("data.num_workers", "data.prefetch_factor")


def override_config(
    cfg: DtrainConfig, overrides: Sequence[str], config_dirs: Sequence[str | Path] = ()
) -> DtrainConfig:
    """Apply overrides to an already resolved config (``dtrain resume``), checked as
    composition checks them. ``group=option`` merges that option's YAML from the search path."""
    from dtrain_cli.config.validate import validate_config
    from dtrain_cli.models import model_spec

    node = OmegaConf.structured(replace(cfg, model=None))
    node.model = model_spec(cfg).config_dict()  # as config.yaml has it (typed again below)
    groups = group_options(config_dirs)
    model_keys = schema_fields(type(cfg.model), "model.") if is_dataclass(cfg.model) else {}
    checked, problems = check_overrides(overrides, groups, extra=model_keys)
    dirs = [*user_config_dirs(config_dirs), builtin_configs_dir()]
    for ov in checked:
        if ov.key == "model" and ov.kind != "delete":  # another model's YAML on these weights
            problems.append(
                f"{ov.text}: cannot change on resume (the checkpoint's model is "
                f"{model_spec(cfg).name}); fixed on resume: {fixed_keys()}"
            )
            continue
        try:
            if ov.key in groups:
                found = next(
                    d / ov.key / f"{ov.value}.yaml"
                    for d in dirs
                    if (d / ov.key / f"{ov.value}.yaml").is_file()
                )
                node[ov.key] = OmegaConf.merge(node[ov.key], OmegaConf.load(found))
        except Exception as exc:  # a group file that does not fit the schema, say
            problems.append(explain_compose_error(exc, [ov.text]))
    problems += apply_values(node, checked)
    problems += list(interpolation_problems(node, checked).values())
    if problems:
        raise ConfigError(problems)
    new = to_dataclass(node)
    validate_config(new)
    return new


def unsafe_resume_changes(old: DtrainConfig, new: DtrainConfig) -> list[str]:
    """One line per key a resume may not change, naming the checkpoint's value."""
    a = flat_keys(OmegaConf.to_container(OmegaConf.structured(old)))
    b = flat_keys(OmegaConf.to_container(OmegaConf.structured(new)))
    out = []
    for key in sorted(a):
        unsafe = key.startswith(UNSAFE_ON_RESUME) and key not in SAFE_ON_RESUME
        if a[key] != b.get(key) and unsafe:
            out.append(
                f"{key}={b.get(key)}: cannot change on resume (the checkpoint has {key}="
                f"{a[key]}); fixed on resume: {fixed_keys()}"
            )
    psgd = "powersgd"
    if old.comm.compression == new.comm.compression == psgd and old.parallel.dp != new.parallel.dp:
        out.append(
            f"parallel.dp={new.parallel.dp}: PowerSGD's error feedback is each rank's own "
            f"(the checkpoint has dp={old.parallel.dp}); resume at dp={old.parallel.dp}, or "
            "drop it with comm.compression=none"
        )
    return out


def fixed_keys() -> str:
    return ", ".join(k + "*" if k.endswith(".") else k for k in UNSAFE_ON_RESUME)
