"""``dtrain sbatch``: a run as a SLURM batch job. Torch-free (``--dry-run`` stays fast).

    dtrain sbatch recipe=gpt_small nodes=2 gpus_per_node=8 partition=gpu time=04:00:00 --dry-run
    dtrain sbatch recipe=gpt_small nodes=2 gpus_per_node=8 --submit     # prints the job id
    dtrain sbatch --validate nodes=2 --submit                          # validate-cluster job
    dtrain sbatch --join runs/exp1 nodes=1 --submit        # more nodes for an elastic run

Compose -> plan (for the job's nodes, not this login node) -> script text
(:func:`dtrain_cli.launch.slurm.render_sbatch`). ``--submit`` creates the run dir
(config.yaml, plan.yaml, slurm/job.sbatch), runs ``sbatch --parsable`` and prints the id.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from dtrain_cli.cli import cluster_shorthands
from dtrain_cli.cli.common import (
    CONFIG_DIR_HELP,
    FORCE_HELP,
    OVERRIDES_HELP,
    cluster_job_warnings,
    complete_override,
    err_console,
    fail,
    print_warnings,
    refuse_over_memory,
)
from dtrain_cli.errors import ConfigError
from dtrain_cli.rundir import env as launch_env
from dtrain_cli.rundir.layout import RunDir

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.launch.slurm import SbatchJob
    from dtrain_cli.plan.plan import Plan


@dataclass
class Built:
    cfg: DtrainConfig
    plan: Plan | None
    job: SbatchJob
    problems: list[str]


def build_job(
    overrides: list[str],
    config_dirs: list[Path],
    validate: bool = False,
    run_dir: Path | None = None,
    python: str | None = None,
    workdir: Path | None = None,
    script: list[str] | None = None,
) -> Built:
    """Compose -> plan for the job's nodes -> :class:`SbatchJob`. Pure apart from reading
    configs; ``run_dir``/``python``/``workdir`` default to the new run dir, this Python and
    the current directory; ``script``: your own script and its arguments (``-- train.py``).
    Raises ConfigError for composition errors."""
    from dtrain_cli.cli.script_args import apply_script, one_process_per_device, script_problems
    from dtrain_cli.config.compose import compose_config, split_recipe
    from dtrain_cli.config.data_checks import unread_data_problems
    from dtrain_cli.launch.rundir import new_run_dir
    from dtrain_cli.launch.slurm import cluster_problems, job_from_plan, job_problems, validate_job
    from dtrain_cli.plan.build import Resources, build_plan

    args = cluster_shorthands.expand(overrides, cluster_shorthands.SLURM_SHORTHANDS)
    recipe, rest = split_recipe(args, "script" if script else "gpt_tiny")
    if problems := script_problems(script):
        raise ConfigError(problems)
    cfg = compose_config(recipe, rest, config_dirs)
    apply_script(cfg, script)
    problems = cluster_problems(cfg.cluster)
    if not script:  # a script's data is its own (dtrain plan checks none either)
        problems += unread_data_problems(cfg)
    gpus = cfg.cluster.gpus_per_node
    if gpus:
        cluster_shorthands.fill_nodes(cfg, args)
    elif script:  # CPU nodes: nproc_per_node=N without dp is N a node, as torchrun's
        one_process_per_device(cfg, args, 0)
    if validate:
        cfg.run.name = cfg.run.name or f"validate-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = (run_dir or new_run_dir(cfg)).resolve()
    python, workdir = python or sys.executable, (workdir or Path.cwd()).resolve()
    plan = None
    if validate:
        job = validate_job(cfg, run_dir, python, workdir)
    else:
        # the plan of the job's nodes: their GPUs and CPUs, not this login node's
        cpus = cfg.cluster.cpus_per_task or Resources.detect().num_cpus
        nodes = Resources(num_gpus=gpus, num_cpus=cpus)
        try:
            plan = build_plan(cfg, nodes, workdir)
        except ConfigError as exc:
            raise ConfigError(problems + exc.problems) from None
        plan.warnings = cluster_job_warnings(cfg, plan, nodes, rest)
        if plan.script is not None:
            from dtrain_cli.plan.script import preemption_warning

            c = cfg.cluster
            said = preemption_warning(plan.script, c.signal, c.signal_lead_s)
            plan.warnings += [said] if said else []
        job = job_from_plan(cfg, plan, run_dir, python, workdir)
        problems += cluster_shorthands.idle_gpu_problems(gpus, plan)
    return Built(cfg, plan, job, problems + job_problems(job))


def sbatch(
    overrides: list[str] = typer.Argument(
        None,
        help=OVERRIDES_HELP + cluster_shorthands.words_help(cluster_shorthands.SLURM_SHORTHANDS),
        autocompletion=complete_override,
    ),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the script (the default)."),
    submit: bool = typer.Option(False, "--submit", help="sbatch it; print the job id."),
    validate: bool = typer.Option(False, "--validate", help="A validate-cluster job instead."),
    join: Path | None = typer.Option(
        None, "--join", help="RUN_DIR of an elastic run: nodes=K more nodes join it."
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Write the run's SLURM batch script: print it (--dry-run) or submit it (--submit).
    Your own script: ``dtrain sbatch nodes=2 dp=8 -- train.py --epochs 3``.

    Guide: docs/clusters.md
    """
    from dtrain_cli.cli.script_args import split_script
    from dtrain_cli.launch.rundir import materialize
    from dtrain_cli.launch.slurm import SCRIPT_NAME, render_sbatch

    if dry_run and submit:
        fail(["--dry-run and --submit: choose one"])
    if join is not None:
        if validate:
            fail(["--join and --validate: choose one"])
        submit_join(join, overrides or [], submit)
        return
    args, script = split_script(overrides or [])
    try:
        built = build_job(args, config_dir, validate, script=script)
    except ConfigError as exc:
        fail(exc.problems)
    if built.problems:
        fail(built.problems)
    print_warnings(built.plan.warnings if built.plan is not None else [])
    script = render_sbatch(built.job)
    if not submit:
        sys.stdout.write(script)
        return
    if built.plan is not None:
        refuse_over_memory(built.cfg, built.plan, force)
    if shutil.which("sbatch") is None:
        fail(["sbatch: not found on PATH; is this a SLURM login node? (--dry-run prints)"], 1)
    run_dir = built.job.run_dir
    fresh, fresh_root = not run_dir.exists(), not run_dir.parent.exists()

    def undo(problem: str, code: int) -> NoReturn:
        """A failed submit leaves no run dir behind (only what this submit created)."""
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
            if fresh_root:
                with contextlib.suppress(OSError):
                    run_dir.parent.rmdir()
        fail([problem], code)

    try:
        if built.plan is not None:
            materialize(built.cfg, built.plan, run_dir)
        RunDir(run_dir).slurm.mkdir(parents=True, exist_ok=True)
        path = RunDir(run_dir).slurm / SCRIPT_NAME
        path.write_text(script)
    except FileExistsError as exc:
        fail([f"run.name={built.cfg.run.name}: {exc}"])
    except OSError as exc:
        undo(f"run dir {run_dir}: cannot create it ({exc})", 2)
    job_id = run_sbatch(path, undo)
    RunDir(run_dir).slurm_job_id.write_text(job_id + "\n")
    err_console.print(f"submitted job {job_id}: {run_dir}", highlight=False, soft_wrap=True)
    warn_if_stuck(job_id, built.cfg)
    print(job_id)


def warn_if_stuck(job_id: str, cfg: DtrainConfig) -> None:
    """A job SLURM accepted but will never start as asked (nodes over the partition's) is
    said now, not found pending hours later."""
    from dtrain_cli.launch.slurm_queue import stuck_reason

    if why := stuck_reason(job_id):
        c = cfg.cluster
        where = f"partition {c.partition}" if c.partition else "the default partition"
        print_warnings(
            [
                f"job {job_id} waits with reason {why} (nodes={cfg.parallel.nnodes}, "
                f"time={c.time or 'unset'} on {where}); it may never start as asked: see "
                f"`sinfo -o '%P %D %T %l'` for what the partition has, and `scancel {job_id}` "
                "if it cannot give it"
            ]
        )


def submit_join(run_dir: Path, overrides: list[str], submit: bool) -> None:
    """``dtrain sbatch --join RUN_DIR nodes=K``: a job whose K nodes join the elastic run
    (:mod:`dtrain_cli.launch.slurm_join`); the run's config.yaml decides the rest."""
    from dtrain_cli.config.compose import config_from_yaml
    from dtrain_cli.launch.slurm_join import JOIN_SCRIPT, join_job, join_problems
    from dtrain_cli.launch.slurm_join import render_join_sbatch as render

    nodes, problems = 1, []
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key in ("nodes", "parallel.nnodes") and value.isdigit():
            nodes = int(value)
        else:
            problems.append(f"{ov}: --join takes only nodes=K (the run's config decides the rest)")
    run_dir = run_dir.resolve()
    run = RunDir(run_dir)
    if not run.is_run():
        problems.append(f"--join {run_dir}: not a run dir (no config.yaml/plan.yaml)")
    if problems:
        fail(problems)
    from dtrain_cli.plan.plan import Plan

    plan = Plan.load(run.plan)
    if problems := join_problems(plan, nodes):
        fail(problems)
    cfg = config_from_yaml(run.config)
    job = join_job(cfg, plan, run_dir, nodes, sys.executable, Path.cwd().resolve())
    text = render(job)
    if not submit:
        sys.stdout.write(text)
        return
    if shutil.which("sbatch") is None:
        fail(["sbatch: not found on PATH; is this a SLURM login node? (--dry-run prints)"], 1)
    path = run.slurm / JOIN_SCRIPT
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        fail([f"{path}: cannot write it ({exc})"])
    job_id = run_sbatch(path, lambda problem, code: fail([problem], code))
    err_console.print(
        f"submitted join job {job_id}: {nodes} node(s) for {run_dir}",
        highlight=False,
        soft_wrap=True,
    )
    warn_if_stuck(job_id, replace(cfg, parallel=replace(cfg.parallel, nnodes=nodes)))
    print(job_id)


def run_sbatch(path: Path, on_error: Callable[[str, int], NoReturn]) -> str:
    """``sbatch --parsable PATH`` -> the job id; ``on_error(line, 1)`` when sbatch fails."""
    env = dict(os.environ)
    # the first step is timed from the job's own start (each agent's): timed from here, a
    # requeued job counted its time in the queue as start-up (agent 186 s)
    env.pop(launch_env.LAUNCH_T0, None)
    out = subprocess.run(
        ["sbatch", "--parsable", str(path)], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        said = "; ".join(ln.strip() for ln in (out.stderr or out.stdout).splitlines() if ln.strip())
        on_error(f"sbatch failed (exit {out.returncode}): {said}", 1)  # one line, as sbatch said
    return out.stdout.strip().split(";")[0]
