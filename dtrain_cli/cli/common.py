"""What every command shares: error reporting, exit codes, composition from CLI arguments."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from dtrain_cli.errors import ConfigError
from dtrain_cli.rundir.protocol import EXIT_CONFIG

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.plan.build import Resources
    from dtrain_cli.plan.plan import Plan

console = Console()
err_console = Console(stderr=True)

OVERRIDES_HELP = (
    "Hydra overrides: recipe=NAME, key=value, group=option, +key=value, ~key; "
    "shorthands dp=, tp=, pp=, lr=, steps=, lr_scaling=, nnodes=, nproc_per_node=; "
    "groups such as precision=bf16."
)
CKPT_HELP = (
    "A run directory or its checkpoints/ folder (the newest complete checkpoint), or one "
    "checkpoints/step_* folder."
)


def checkpoint_arg(ckpt: Path | None, args: list[str], command: str) -> tuple[Path, list[str]]:
    """``--ckpt PATH``, or the path written without it (``dtrain resume runs/<run>``, as
    ``dtrain checkpoints runs/<run>`` takes it; first or after the overrides, the one
    argument that is not one); the rest of ``args`` as they are."""
    paths = [a for a in args if "=" not in a and not a.startswith(("+", "~"))]
    if ckpt is None and (paths[:1] == args[:1] or len(paths) == 1) and paths:
        return Path(paths[0]), [a for a in args if a is not paths[0]]
    if ckpt is None:
        fail(
            [
                f"no checkpoint named: dtrain {command} runs/<run> (or --ckpt PATH: a run "
                "directory, its checkpoints/ folder or one checkpoints/step_* folder)"
            ]
        )
    return ckpt, args


FORCE_HELP = "Submit it although its memory estimate is far above its devices' memory."
CONFIG_DIR_HELP = "Extra config folder (group folders and recipes/); also $DTRAIN_CONFIG_PATH."


def complete_override(incomplete: str) -> list[str]:
    """Shell completion of an override: recipe names, group options, config keys."""
    from dtrain_cli.config.overrides import SHORTHANDS, schema_fields
    from dtrain_cli.config.search import group_options, list_recipes

    key, eq, _ = incomplete.partition("=")
    if eq:
        if key == "recipe":
            values = list(list_recipes())
        else:
            values = group_options().get(key, [])
            if schema_fields().get(SHORTHANDS.get(key, key), None) is not None:
                values = values or ["true", "false"] * (
                    schema_fields()[SHORTHANDS.get(key, key)].base == "bool"
                )
        return [f"{key}={v}" for v in values if f"{key}={v}".startswith(incomplete)]
    words = ["recipe", *group_options(), *SHORTHANDS, *schema_fields()]
    prefix = incomplete[: len(incomplete) - len(incomplete.lstrip("+~"))]
    body = incomplete[len(prefix) :]
    return [f"{prefix}{w}" + ("" if prefix == "~" else "=") for w in words if w.startswith(body)]


def fail(problems: Sequence[str], code: int = EXIT_CONFIG) -> NoReturn:
    for p in problems:
        err_console.print(
            f"[bold red]error:[/] {escape(_option_hint(p))}",
            markup=True,
            highlight=False,
            soft_wrap=True,
        )
    raise typer.Exit(code)


def _option_hint(problem: str) -> str:
    """``'--formt': not an option of this command (see --help)`` names the command's
    closest option instead, where one is close (the config layer knows no command)."""
    import difflib
    import re

    found = re.match(r"'(--?[\w-]+)(?:[= ][^']*)?': not an option of this command", problem)
    if found is None:
        return problem
    names = [n for n in _command_options() if n.startswith("--")]
    close = difflib.get_close_matches(found.group(1), names, 1, cutoff=0.75)
    return problem.replace("(see --help)", f"(did you mean {close[0]}?)") if close else problem


def _command_options() -> list[str]:
    """The option names of the command running now, from click's context: Typer's own
    copy of click (typer 0.28) or click itself, whichever its Context comes from."""
    import importlib

    base = next((c for c in typer.Context.__mro__ if c.__module__.endswith(".core")), None)
    try:
        globals_ = importlib.import_module(base.__module__.removesuffix("core") + "globals")
        ctx = globals_.get_current_context(silent=True)
    except (AttributeError, ImportError):  # another Typer's layout: no hint, the line stands
        return []
    if ctx is None:
        return []
    return [o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts)]


def compose_and_plan(
    overrides: Sequence[str],
    config_dirs: Sequence[Path],
    script: list[str] | None = None,
    *,
    on_hardware: bool = False,
    on_composed: Callable[[DtrainConfig], None] | None = None,
):
    """recipe=... + overrides (+ a script and its arguments: ``dtrain run``) -> (typed
    config, plan). ``on_hardware``: planned for nodes of the config's hardware profile,
    not this machine (``dtrain simulate``; as many nodes as the world needs unless the
    command line says). ``on_composed``: called with the composed config before the plan
    is made (the launch tells its fork server what to import). ConfigError -> exit 2."""
    from dtrain_cli.cli.script_args import script_problems
    from dtrain_cli.config.compose import compose_config, split_recipe
    from dtrain_cli.config.data_checks import data_problems
    from dtrain_cli.plan.build import build_plan, node_of, nodes_needed
    from dtrain_cli.plan.script import is_script

    if problems := script_problems(script):
        fail(problems)
    try:
        recipe, rest = split_recipe(overrides, "script" if script else "gpt_tiny")
    except ConfigError as exc:
        fail(exc.problems)
    try:
        cfg = compose_config(recipe, rest, config_dirs, validate=False)  # build_plan checks
    except ConfigError as exc:
        problems = exc.problems
        if exc.config is not None:  # some overrides were wrong: what else is, without them
            _as_script(exc.config, rest, script)
            try:
                build_plan(exc.config)
            except ConfigError as more:
                problems = problems + [p for p in more.problems if p not in problems]
        fail(problems)
    if on_composed is not None:
        on_composed(cfg)
    _as_script(cfg, rest, script)
    # paths and targets exist, before any write; a script's data is its own business
    problems = [] if is_script(cfg) else data_problems(cfg, config_dirs)
    if on_hardware and not _names_nodes(rest):
        cfg.parallel.nnodes = nodes_needed(cfg) or cfg.parallel.nnodes
    try:
        plan = build_plan(cfg, node_of(cfg) if on_hardware else None)
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        fail(problems)
    from dtrain_cli.plan.naming import defaults_note

    if note := defaults_note(cfg, rest):
        plan.warnings.insert(0, note)
    from dtrain_cli.config.recipe_checks import group_choice_warnings

    plan.warnings += group_choice_warnings(str(recipe), rest, config_dirs)
    plan.warnings += more_warnings(cfg, plan, rest, on_hardware=on_hardware)
    return cfg, plan


def _as_script(cfg: DtrainConfig, overrides: Sequence[str], script: list[str] | None) -> None:
    """The command line's script in ``cfg``, and its rank count (one per GPU, or
    ``nproc_per_node`` a node), also when other overrides failed: the rest is checked
    against what the run would be."""
    if not script:
        return
    from dtrain_cli.cli.script_args import apply_script, one_process_per_device
    from dtrain_cli.plan.build import visible_gpu_count

    apply_script(cfg, script)
    one_process_per_device(cfg, overrides, visible_gpu_count())


def fit_warning(
    cfg: DtrainConfig, plan: Plan, *, resources: Resources | None = None, on_hardware: bool = False
) -> str | None:
    """A peak memory above the device's, planned again at smaller micro-batches to name
    one that fits (:mod:`dtrain_cli.plan.fit`). Each replan gets the plan's own nodes:
    ``resources`` (a cluster job's), else the hardware profile's node (``on_hardware``),
    else this machine."""
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.build import build_plan, node_of
    from dtrain_cli.plan.fit import memory_warning

    def replan(other: DtrainConfig) -> Plan:
        if resources is not None:
            return build_plan(other, resources)
        return build_plan(other, node_of(other) if on_hardware else None)

    return memory_warning(cfg, model_spec(cfg), plan, replan)


def refuse_over_memory(cfg: DtrainConfig, plan: Plan, force: bool) -> None:
    """A job for a cluster's queue estimated far above its devices' memory ends here, exit
    2, nothing submitted or written, unless ``--force`` (:func:`.fit.submit_refusal`)."""
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.fit import submit_refusal

    if not force and (refusal := submit_refusal(cfg, model_spec(cfg), plan)):
        fail([refusal])


def cluster_job_warnings(
    cfg: DtrainConfig, plan: Plan, resources: Resources, overrides: Sequence[str]
) -> list[str]:
    """What ``dtrain plan`` adds to a plan's own warnings, for a job planned on a cluster's
    nodes (``dtrain sbatch``, ``dtrain k8s``). Said before the job waits in a queue."""
    said = [*plan.warnings, *more_warnings(cfg, plan, overrides, resources=resources)]
    if plan.device == "cuda" and cfg.hardware.device == "cpu" and plan.script is None:
        # the default profile is this machine's CPU: a GPU job's estimates, MFU and (k8s)
        # grace period were of it (gpt_1b's pods waited 6 days to be killed)
        said.append(
            f"hardware={cfg.hardware.name}: a CPU's profile for a job of GPUs; its step time, "
            "MFU (and a pod's grace period) are estimated on it: give your GPUs' "
            "(hardware=h100_80g, a100_80g, h200, or your own configs/hardware/NAME.yaml)"
        )
    return said


def more_warnings(
    cfg: DtrainConfig,
    plan: Plan,
    overrides: Sequence[str],
    *,
    resources: Resources | None = None,
    on_hardware: bool = False,
) -> list[str]:
    """What the commands say beside the plan's own warnings (plan, launch, resume, sbatch,
    k8s): keys of ``overrides`` the layout never reads, a peak memory above the device's
    (planned again on the plan's nodes: see :func:`fit_warning`)."""
    from dtrain_cli.plan.unread import unread_warnings

    said = unread_warnings(cfg, list(overrides))
    if plan.script is None and (
        fit := fit_warning(cfg, plan, resources=resources, on_hardware=on_hardware)
    ):
        said.append(fit)
    if plan.script is None and plan.device == "cpu" and resources is None and not on_hardware:
        import os

        from dtrain_cli.plan.fit import host_warnings

        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        said += host_warnings(plan, len(os.sched_getaffinity(0)), ram)
    return said


def print_warnings(warnings: Sequence[str]) -> None:
    """``warning: ...`` on stderr, one per line as written (launch, sbatch, k8s)."""
    for w in warnings:
        err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)


def _names_nodes(overrides: Sequence[str]) -> bool:
    """Whether the command line sets the node count or processes per node itself."""
    from dtrain_cli.config.compose import expand_shorthands

    keys = {o.split("=", 1)[0].lstrip("+~") for o in expand_shorthands(overrides)}
    return bool(keys & {"parallel.nnodes", "parallel.nproc_per_node"})


def is_tty() -> bool:
    return sys.stdout.isatty()


def print_whole(renderable: RenderableType) -> None:
    """A table as rich fits it to the terminal; piped (``| grep``, ``> file``) at the width
    where no cell wraps or is cut, where rich's 80-column default would end paths in '…'."""
    if is_tty():
        console.print(renderable)
        return
    if isinstance(renderable, Table) and renderable.title:  # wrapped to the table's width
        renderable.min_width = max(renderable.min_width or 0, len(str(renderable.title)))
    wide = console.options.update(width=10**4)
    width = Measurement.get(console, wide, renderable).maximum
    Console(width=max(80, width)).print(renderable)
