"""``dtrain resume --ckpt runs/<run>[/checkpoints/step_N] [overrides]``: continue a run.

Re-reads the run's config, applies safe overrides (more steps, another dp, new cadence),
refuses unsafe ones (model shape, data, seed), and starts workers in the same run dir;
they load the checkpoint (DCP reshards to the new layout) and continue the sample stream.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dtrain_cli.cli.common import (
    CKPT_HELP,
    CONFIG_DIR_HELP,
    checkpoint_arg,
    complete_override,
    err_console,
    fail,
    more_warnings,
    print_warnings,
)
from dtrain_cli.errors import ConfigError
from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.plan.plan import Plan

RESUME_OVERRIDES_HELP = (
    "Overrides for the continued run (key=value, +key=value, ~key, group=option): steps, "
    "layout (dp=, tp=, pp=, train.micro_batch_size=), checkpoint cadence, logging, LR values. "
    "Not recipe= (a resume continues its own run), model.*, data.* (but data.num_workers, "
    "data.prefetch_factor), train.seed, optim.name, run.root, run.name, run.recipe."
)


def recipe_problems(overrides: list[str]) -> list[str]:
    """``recipe=``/``run.recipe=``: the run's recipe is the checkpoint's, never another."""
    out = []
    for ov in overrides:
        key = ov.lstrip("+~").split("=", 1)[0].strip()
        if key in ("recipe", "run.recipe"):
            out.append(
                f"{ov}: a resume continues its own run, with the recipe and config saved in "
                "its checkpoint; drop it (or start a new run: dtrain launch recipe=NAME)"
            )
    return out


def resume(
    ckpt: Path = typer.Option(
        None, "--ckpt", help=CKPT_HELP + " Or give it first, without --ckpt."
    ),
    overrides: list[str] = typer.Argument(
        None, help=RESUME_OVERRIDES_HELP, autocompletion=complete_override
    ),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
) -> None:
    """Continue a run from a checkpoint (the newest complete one of a run directory).

    Guide: docs/checkpoints.md
    """
    ckpt, overrides = checkpoint_arg(ckpt, list(overrides or []), "resume")
    if problems := recipe_problems(overrides):
        fail(problems)

    env.mark_launch_start()
    from dtrain_cli.cli.agent_cmd import is_script_run

    if RunDir(ckpt).is_run() and is_script_run(ckpt):  # its checkpoints are the script's
        resume_script(ckpt.resolve(), list(overrides or []))
        return
    from dtrain_cli.checkpoint import catalog

    def warn(msg: str) -> None:  # whole lines: a path in it stays one to copy
        print_warnings([msg])

    try:  # the path first: a wrong one starts nothing (no fork server, no torch)
        run_dir, path = catalog.resolve(ckpt, warn)
    except catalog.CheckpointError as exc:
        fail([str(exc)])
    run_dir = run_dir.resolve()
    from dtrain_cli.cli.launch_cmd import hold_run_dir

    hold_run_dir(run_dir)  # before anything of the run is moved or written
    from dtrain_cli.launch import worker_server

    worker_server.start(overrides)
    cfg, plan = replan(path, list(overrides or []), config_dir)
    composed = time.time()
    if plan.nnodes > 1 or plan.elastic is not None:  # it waited for nodes that never came
        fail([several_nodes(plan)])
    step = catalog.read_meta(path).get("step", 0)
    if plan.steps <= step:
        fail(
            [
                f"train.steps={plan.steps}: the checkpoint is already at step {step}; "
                f"set train.steps above {step} to continue"
            ]
        )
    for said in changes_said(path, cfg, plan, step):
        warn(said)
    from dtrain_cli.cli.launch_cmd import start_workers

    before = run_files(run_dir)
    set_aside: list[Path] = []
    try:  # from the first file moved: a failure puts back what it moved (a full disk too)
        set_aside = catalog.set_aside_newer(run_dir, step)
        for moved in set_aside:
            warn(f"newer checkpoint set aside (resuming from step {step}): {moved}")
        record_resume(run_dir, cfg, plan, path, step, list(overrides or []))
        err_console.print(
            f"resuming {run_dir.name} from {path.name} (step {step})", highlight=False
        )
        start_workers(run_dir, cfg, plan, milestones={"composed": composed})
    except BaseException as exc:
        ok = isinstance(exc, typer.Exit) and exc.exit_code == 0
        if not ok and undo_if_untrained(run_dir, step, before):
            catalog.put_back(run_dir, set_aside)
            again = ", its newer checkpoints back in place" if set_aside else ""
            err_console.print(
                f"nothing trained past step {step}: the run's config.yaml and plan.yaml "
                f"are as before this resume{again}",
                highlight=False,
                soft_wrap=True,
            )
        if isinstance(exc, OSError):  # the run dir could not be written (a full disk)
            fail([f"{run_dir}: cannot record this resume ({exc.strerror or exc}); nothing started"])
        raise


LR_KEYS = ("steps", "peak_lr", "warmup_steps", "decay", "min_lr")


def lr_change(path: Path, plan: Plan, step: int) -> str | None:
    """A resume whose LR schedule is not the checkpoint's at the step it continues with
    (``train.steps=30`` after 20: the cosine decay spans 30 steps, and the LR jumps back up
    from 1.2e-4 to 5.5e-4), said with both values; None when it is the same."""
    from dtrain_cli.plan.plan import Plan

    try:
        old = Plan.load(path / "plan.yaml").lr
    except (OSError, ValueError, KeyError, TypeError):
        return None
    was, now = old.lr_at(step), plan.lr.lr_at(step)
    if abs(now - was) <= 1e-3 * max(abs(was), 1e-12):
        return None
    changed = [f"{k} {getattr(old, k)} -> {getattr(plan.lr, k)}" for k in LR_KEYS
               if getattr(old, k) != getattr(plan.lr, k)]  # fmt: skip
    return (
        f"the LR schedule changes with this resume ({', '.join(changed)}): step {step + 1} "
        f"runs at lr {now:.3g}, where the checkpoint's schedule had {was:.3g}"
    )


def changes_said(path: Path, cfg: DtrainConfig, plan: Plan, step: int) -> list[str]:
    """What this resume changes of the run's schedule, batch and val loss."""
    lr = lr_change(path, plan, step)
    return [*([lr] if lr else []), *definition_changes(path, cfg, plan, step)]


def definition_changes(path: Path, cfg: DtrainConfig, plan: Plan, step: int) -> list[str]:
    """What a resume changes of what the curves mean: the samples a step takes and the ones
    the val loss is over (both were silent; a new user's find)."""
    import yaml

    from dtrain_cli.plan.plan import Plan

    try:
        old_plan = Plan.load(path / "plan.yaml")
        old_cfg = yaml.safe_load((path / "config.yaml").read_text()) or {}
        old_batch, old_eval = old_plan.batch.global_batch_size, old_cfg["train"]
        old_precision = (old_cfg.get("precision") or {}).get("name", cfg.precision.name)
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return []
    out = []
    if old_precision != cfg.precision.name:
        out.append(
            f"precision {old_precision} -> {cfg.precision.name}: the steps after {step} "
            "compute at another precision (the curve goes on, not as the run's would have)"
        )
    if (old_plan.mesh.shape, old_plan.strategy) != (plan.mesh.shape, plan.strategy):
        out += layout_numerics(old_plan, plan, cfg, step)
    if old_batch != plan.batch.global_batch_size:
        out.append(
            f"the global batch changes with this resume ({old_batch} -> "
            f"{plan.batch.global_batch_size} samples): steps after {step} take "
            f"{plan.batch.global_batch_size} samples each, where the run's first {step} took "
            f"{old_batch}"
        )
    if old_eval.get("eval_batches") != cfg.train.eval_batches:
        out.append(
            f"train.eval_batches {old_eval.get('eval_batches')} -> {cfg.train.eval_batches}: "
            f"the val loss after step {step} is over other samples than before it"
        )
    return out


def layout_numerics(old: Plan, plan: Plan, cfg: DtrainConfig, step: int) -> list[str]:
    """A resume at another layout continues within 1e-5 in fp32 without dropout; dropout's
    masks and bf16 sums are the layout's own (8e-4 after a few steps)."""
    from dtrain_cli.strategies import strategy_for

    why = []
    if dropout := getattr(cfg.model, "dropout", 0) or 0:
        why.append(f"dropout {dropout} draws its masks by rank")
    sharded = any(strategy_for(p.strategy).shards_params for p in (old, plan))
    if cfg.precision.name != "fp32" and sharded:
        why.append(f"{cfg.precision.name} parameters under FSDP round their own way")
    elif cfg.precision.name != "fp32" and old.mesh.shape != plan.mesh.shape:
        why.append(f"{cfg.precision.name} sums (tp's all-reduces, dp's) round by layout")
    if not why:
        return []
    labels = f"{old.mesh.label()} {old.strategy} -> {plan.mesh.label()} {plan.strategy}"
    return [
        f"the layout changes with this resume ({labels}) and {', '.join(why)}: the steps "
        f"after {step} follow the run's curve closely, not bit for bit"
    ]


def several_nodes(plan: Plan) -> str:
    nodes = f"{plan.elastic.min_nnodes}:{plan.elastic.max_nnodes}" if plan.elastic else plan.nnodes
    return (
        f"parallel.nnodes={nodes}: dtrain resume starts this machine's workers only; continue "
        "here with parallel.nnodes=1, or on every node: its launch command again (dtrain "
        "launch --nnodes ...), or the cluster's own restart (a requeued `dtrain sbatch` job, "
        "a restarted `dtrain k8s` pod: each runs dtrain agent)"
    )


def replan(path: Path, overrides: list[str], config_dir: list[Path]) -> tuple[DtrainConfig, Plan]:
    """The checkpoint's config with the safe ``overrides``, planned again, with what
    ``dtrain launch`` warns of besides the plan's own: keys the layout never reads, a peak
    memory above the device's (a larger micro-batch, or a sharded run on fewer devices)."""
    from dtrain_cli.config.compose import config_from_yaml
    from dtrain_cli.config.resume_changes import override_config
    from dtrain_cli.plan.build import build_plan
    from dtrain_cli.plan.resume import resume_problems

    try:
        old = config_from_yaml(RunDir(path).config)  # the checkpoint's copy
        cfg = override_config(old, overrides, config_dir)
        problems = resume_problems(old, cfg)
        if problems:
            raise ConfigError(problems)
        plan = build_plan(cfg)
    except ConfigError as exc:
        fail(exc.problems)
    plan.warnings += more_warnings(cfg, plan, overrides)
    return cfg, plan


def run_files(run_dir: Path) -> dict[str, str | float]:
    """The run's config, plan and record of resumes as they are, and the time (for
    :func:`undo_if_untrained`)."""
    run = RunDir(run_dir)
    before: dict[str, str | float] = {"time": time.time()}
    for file in (run.config, run.plan, run.resumes):
        if file.is_file():
            before[file.name] = file.read_text()
    return before


def record_resume(
    run_dir: Path, cfg: DtrainConfig, plan: Plan, path: Path, step: int, overrides: list[str]
) -> None:
    """A line in the run's record of resumes, then its config and plan as continued."""
    from dtrain_cli.config.compose import config_to_yaml
    from dtrain_cli.launch.rundir import run_config_text

    run = RunDir(run_dir)
    line = {"time": time.time(), "checkpoint": str(path), "step": step, "overrides": overrides}
    with open(run.resumes, "a") as f:
        f.write(json.dumps(line) + "\n")
    # a one-node run's data paths absolute from here on (as a launch writes them)
    run.config.write_text(run_config_text(cfg) if plan.nnodes == 1 else config_to_yaml(cfg))
    plan.save(run.plan)


def undo_if_untrained(run_dir: Path, step: int, before: dict[str, str | float]) -> bool:
    """A resume that failed before it left anything past ``step`` (a newer checkpoint, a
    logged step): the run dir describes its checkpoints again, not a layout that never
    trained (its config and plan as they were, the resume's line gone)."""
    from dtrain_cli.checkpoint import catalog

    run = RunDir(run_dir)
    if any(c.step > step for c in catalog.list_checkpoints(run_dir)):
        return False
    with contextlib.suppress(OSError, ValueError):
        for line in run.metrics.read_text().splitlines():
            record = json.loads(line)
            if record.get("step", 0) > step and record.get("time", 0) >= before["time"]:
                return False
    for file in (run.config, run.plan, run.resumes):
        with contextlib.suppress(OSError):  # a full disk: the checkpoints go back regardless
            if file.name in before:
                file.write_text(str(before[file.name]))
            else:
                file.unlink(missing_ok=True)
    return True


def resume_script(run_dir: Path, overrides: list[str]) -> None:
    """A ``dtrain run`` script's run: its script runs again in the same run directory,
    with its config and plan (it finds its own checkpoints there, as after a SLURM requeue);
    what a preempted script run outside SLURM continues with."""
    from dtrain_cli.config.compose import config_from_yaml
    from dtrain_cli.plan.plan import Plan

    run = RunDir(run_dir)
    plan = Plan.load(run.plan)
    if overrides:
        fail(
            [
                f"{' '.join(overrides)}: a script run resumes as it was started (its checkpoints "
                "are its own); drop the overrides, or start a new run with dtrain run"
            ]
        )
    if plan.nnodes > 1:
        fail(
            [
                f"{run_dir}: a multi-node script run continues on every node: its launch "
                "command again (dtrain run --nnodes ...), or dtrain agent"
            ]
        )
    if (done := protocol.read_finished(run)) is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(done.get("time", 0)))
        fail(
            [
                f"{run_dir}: its script finished (exit 0, {when}); dtrain resume continues a "
                "run that stopped: start a new one with dtrain run"
            ]
        )
    from dtrain_cli.cli.launch_cmd import hold_run_dir
    from dtrain_cli.launch import worker_server
    from dtrain_cli.launch.preload import SCRIPT_FIRST

    hold_run_dir(run_dir)

    worker_server.start([f"launcher.start_method={plan.start_method}"], first=SCRIPT_FIRST)
    cfg = config_from_yaml(run.config)
    with open(run.resumes, "a") as f:
        f.write(json.dumps({"time": time.time(), "checkpoint": None, "script": True}) + "\n")
    err_console.print(
        f"resuming {run_dir.name}: its script runs again in its run directory", highlight=False
    )
    from dtrain_cli.cli.launch_cmd import start_workers

    start_workers(run_dir, cfg, plan, milestones={"composed": time.time()})
