"""Keys the command line sets that this layout never reads, named in the plan's warnings.
Torch-free.

    dtrain launch recipe=gpt_tiny pipeline.microbatches=4     # pp=1: no pipeline to split
    dtrain launch recipe=gpt_small dp=4 sync.outer_lr=0.5     # sync.mode=sync: not DiLoCo
    dtrain run dp=2 debug.collective_timeout_s=60 -- train.py # dtrain's trainer's watchdog

Each would otherwise train as if it had not been typed and say nothing. Only what the
command line sets is named: a recipe may hold a pipeline schedule for when it runs with
pp > 1. A warning, not an error: the run is what the rest of the config says.
"""

from __future__ import annotations

from collections.abc import Sequence

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.strategies import strategy_for
from dtrain_cli.sync_modes import mode_for, names


def unread_warnings(cfg: DtrainConfig, overrides: Sequence[str]) -> list[str]:
    """One line per ``key=value`` of ``overrides`` that the layout of ``cfg`` ignores."""
    from dtrain_cli.config.compose import expand_shorthands

    out, given = [], {}
    for typed, override in zip(overrides, expand_shorthands(overrides), strict=True):
        key = override.lstrip("+~").split("=", 1)[0]
        given.setdefault(key, []).append((typed, override))
        if why := _ignored_because(cfg, key):
            out.append(f"{override}: {why}; ignored")
    return out + _given_twice(given)


def _given_twice(given: dict[str, list[tuple[str, str]]]) -> list[str]:
    """``dp=2 ... parallel.dp=1``: the last wins (Hydra's rule), which a long command line
    or a script that appends to one hides; said when the values differ."""
    out = []
    for key, typed in given.items():
        if len({full for _, full in typed}) > 1:
            last = typed[-1][0]
            out.append(
                f"{key} given {len(typed)} times ({', '.join(t for t, _ in typed)}): the last, "
                f"{last}, is used"
            )
    return out


OPTIMIZER_KEYS = {"momentum": "sgd", "beta1": "adamw", "beta2": "adamw", "eps": "adamw"}
"""The optim keys one optimizer reads (runtime/state/optim.py); the other ignores them."""


def _ignored_because(cfg: DtrainConfig, key: str) -> str | None:
    section, _, name = key.partition(".")
    par = cfg.parallel
    if section == "optim" and (reader := OPTIMIZER_KEYS.get(name)) and reader != cfg.optim.name:
        return f"read only by optim={reader} (optim.name={cfg.optim.name})"
    scaling = key in ("precision.init_scale", "precision.growth_interval")
    if scaling and cfg.precision.name != "fp16":
        return f"read only with precision=fp16, its loss scaling (precision={cfg.precision.name})"
    if section == "debug" and (cfg.script.path or cfg.script.module):
        if name == "collective_timeout_s":  # what a script's hang is limited by instead
            return (
                "read only by dtrain's own trainer; your script's limit is its process "
                "group's: init_process_group(timeout=timedelta(seconds=N))"
            )
        return "read only by dtrain's own trainer, not by your script"
    if section == "pipeline" and par.pp == 1:
        return "read only with pp > 1 (parallel.pp=1)"
    if key == "parallel.tp_plan" and par.tp == 1:
        return "read only with tp > 1 (parallel.tp=1)"
    if section == "comm" and par.dp == 1:
        return "read only with dp > 1 (parallel.dp=1: no gradient is all-reduced)"
    if key == "comm.bucket_mb" and not strategy_for(par.strategy).comm_hooks:
        return (
            f"read only by DDP's buckets (strategy ddp or zero1; parallel.strategy={par.strategy})"
        )
    if key.startswith("comm.powersgd_") and cfg.comm.compression != "powersgd":
        return f"read only with comm.compression=powersgd (comm.compression={cfg.comm.compression})"
    if section == "sync" and name and name != "mode":
        field = name.split(".", 1)[0]
        if field not in mode_for(cfg.sync.mode).reads:
            readers = [m for m in names() if field in mode_for(m).reads]
            if readers:
                read_by = " or ".join(f"sync.mode={m}" for m in readers)
                return f"read only by {read_by} (sync.mode={cfg.sync.mode})"
    if key.startswith(("debug.replica_check_every", "debug.replica_check_grads")):
        from dtrain_cli.plan.memory import nproc_guess

        strategy = strategy_for(par.strategy)
        shard_groups = strategy.dp_replicate(cfg, nproc_guess(cfg))
        replicas = par.dp > 1 and (strategy.holds_replicas or shard_groups > 1)
        if not replicas and par.tp == 1:  # nothing to compare
            why = "dp=1" if par.dp == 1 else f"parallel.strategy={par.strategy} shards them"
            return (
                "read only where ranks hold replicas (dp > 1 under ddp or zero1, hsdp's shard "
                f"groups, or tp > 1; {why})"
            )
    if key == "parallel.fsdp_units" and not _reads_fsdp_units(cfg):
        return (
            "read only by model=custom; the other kinds wrap their own blocks (model=hf: the "
            "classes its _no_split_modules names)"
        )
    return None


def _reads_fsdp_units(cfg: DtrainConfig) -> bool:
    from dtrain_cli.models import spec_class

    try:
        return spec_class(cfg.model.kind).reads_fsdp_units
    except Exception:  # an unknown kind: said by the model's own checks
        return True
