"""``dtrain k8s``: a run as a Kubernetes JobSet (docs/kubernetes.md). Torch-free.

    dtrain k8s recipe=gpt_small parallel.nnodes=4 cluster.gpus_per_node=8 \\
        cluster.image=registry.example/team/train:1.0 --dry-run      # print the manifest
    dtrain k8s ... cluster.queue=team-a --out job.yaml                 # kubectl apply -f job.yaml
    dtrain k8s ... --submit            # create it, then follow its status and rank 0's logs
    dtrain k8s status NAME;  dtrain k8s logs NAME --rank 1;  dtrain k8s cancel NAME

Compose -> plan for the pods (their GPUs, not this machine's) -> manifest
(:func:`dtrain_cli.launch.k8s.manifest.render_manifest`, pure). Only ``--submit``,
``status``, ``logs`` and ``cancel`` import the ``kubernetes`` client.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

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

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.launch.k8s.job import K8sJob
    from dtrain_cli.plan.plan import Plan

OVERRIDE_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}
CONTEXT_HELP = "kube-context (default: the current one)."
NAMESPACE_HELP = "Namespace (default: cluster.namespace, else the context's)."


class OverridesGoToJob(TyperGroup):
    """``dtrain k8s OVERRIDES`` is ``dtrain k8s job OVERRIDES``: anything that is not a
    subcommand's name (or --help) goes to ``job``."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["job", *args]
        return super().parse_args(ctx, args)


k8s_app = typer.Typer(
    cls=OverridesGoToJob,
    name="k8s",
    no_args_is_help=True,
    help=(
        "A run on Kubernetes: a JobSet (or a Kubeflow TrainJob) from the same plan; "
        "guide: docs/kubernetes.md.\n\n"
        "dtrain k8s recipe=gpt_small parallel.nnodes=4 cluster.gpus_per_node=8 "
        "cluster.image=IMAGE --dry-run | --out job.yaml | --submit"
    ),
)


def build(overrides: list[str], config_dirs: list[Path]) -> tuple[DtrainConfig, Plan, K8sJob]:
    """Compose -> the pods' plan -> :class:`K8sJob`. Raises ConfigError with every problem."""
    from dtrain_cli.config.compose import compose_config, split_recipe
    from dtrain_cli.config.data_checks import unread_data_problems
    from dtrain_cli.launch.k8s.job import (
        cluster_problems,
        default_name,
        job_from_plan,
        job_problems,
        pod_config,
    )
    from dtrain_cli.plan.build import Resources, build_plan

    slurm, args = cluster_shorthands.slurm_only(overrides)
    args = cluster_shorthands.expand(args, cluster_shorthands.NODE_SHORTHANDS)
    recipe, rest = split_recipe(args, "gpt_tiny")
    try:
        cfg = compose_config(recipe, rest, config_dirs)
    except ConfigError as exc:
        raise ConfigError(slurm + exc.problems) from None
    if cfg.cluster.gpus_per_node:
        cluster_shorthands.fill_nodes(cfg, rest)
    cfg.run.name = default_name(cfg)
    c = cfg.cluster
    problems = slurm + cluster_problems(cfg, cfg.run.name) + unread_data_problems(cfg)
    # the pods' resources, not this machine's: without cpus_per_task, one thread per process
    resources = Resources(num_gpus=c.gpus_per_node, num_cpus=c.cpus_per_task or 1)
    try:
        plan = build_plan(cfg, resources)
    except ConfigError as exc:
        raise ConfigError(problems + exc.problems) from None
    if problems:
        raise ConfigError(problems)
    plan.warnings = cluster_job_warnings(cfg, plan, resources, rest)
    pods_cfg = pod_config(cfg, cfg.run.name)
    job = job_from_plan(pods_cfg, plan, cfg.run.name)
    if problems := job_problems(job, plan) + cluster_shorthands.idle_gpu_problems(
        c.gpus_per_node, plan
    ):
        raise ConfigError(problems)
    return pods_cfg, plan, job


@k8s_app.command("job", context_settings=OVERRIDE_SETTINGS)
def job_cmd(
    overrides: list[str] = typer.Argument(
        None,
        help=OVERRIDES_HELP + cluster_shorthands.words_help(cluster_shorthands.NODE_SHORTHANDS),
        autocompletion=complete_override,
    ),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the manifest (the default)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write it to this file."),
    submit: bool = typer.Option(False, "--submit", help="Create it in the cluster."),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="After --submit."),
    context: str | None = typer.Option(None, "--context", help=CONTEXT_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """The run's manifest (ConfigMap + JobSet): print it, write it (--out) or create it
    (--submit; then follow its status and rank 0's logs). `dtrain k8s OVERRIDES` is this."""
    from dtrain_cli.launch.k8s.job import job_warnings
    from dtrain_cli.launch.k8s.render import documents, render_manifest

    if dry_run and (submit or out is not None):
        fail(["--dry-run prints the manifest; --out and --submit do more: choose"])
    try:
        cfg, plan, job = build(list(overrides or []), config_dir)
    except ConfigError as exc:
        fail(exc.problems)
    print_warnings([*plan.warnings, *job_warnings(job)])
    if submit:
        refuse_over_memory(cfg, plan, force)
    text = render_manifest(job)
    if out is not None:
        try:
            out.write_text(text)
        except OSError as exc:
            fail([f"--out {out}: cannot write it ({exc.strerror or exc})"])
        err_console.print(f"wrote {out}: kubectl apply -f {out}", highlight=False, soft_wrap=True)
    elif not submit:
        sys.stdout.write(text)
    if not submit:
        return
    from dtrain_cli.launch.k8s import api

    try:
        kc = api.connect(context, job.cluster.namespace)
        created = api.create(kc, documents(job))
    except api.KubeError as err:
        fail([str(err)], err.code)
    kind = created["kind"]
    err_console.print(
        f"created {kind} {job.name} in namespace {kc.namespace} ({job.summary})",
        highlight=False,
        soft_wrap=True,
    )
    print(job.name)
    if follow:
        _follow(kc, job.name)


def _follow(kc, name: str) -> None:
    from dtrain_cli.launch.k8s import api

    try:
        code = api.follow(kc, name, _write)
    except KeyboardInterrupt:
        err_console.print(
            f"stopped following; {name} keeps running: dtrain k8s status {name}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130) from None
    except api.KubeError as err:
        fail([str(err)], err.code)
    raise typer.Exit(code)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _cluster(context: str | None, namespace: str | None):
    from dtrain_cli.launch.k8s import api

    try:
        return api.connect(context, namespace)
    except api.KubeError as err:
        fail([str(err)], err.code)


@k8s_app.command()
def status(
    name: str = typer.Argument(..., help="The JobSet's (TrainJob's) name: the run name."),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help=NAMESPACE_HELP),
    context: str | None = typer.Option(None, "--context", help=CONTEXT_HELP),
) -> None:
    """State, restarts and pods of a run (exit 1 when it failed)."""
    from dtrain_cli.launch.k8s import api

    kc = _cluster(context, namespace)
    try:
        lines, now = api.status_lines(kc, name)
    except api.KubeError as err:
        fail([str(err)], err.code)
    print("\n".join(lines))
    raise typer.Exit(1 if now == "Failed" else 0)


@k8s_app.command()
def logs(
    name: str = typer.Argument(..., help="The run name."),
    rank: int = typer.Option(0, "--rank", help="Node rank (the pod's completion index)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing."),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help=NAMESPACE_HELP),
    context: str | None = typer.Option(None, "--context", help=CONTEXT_HELP),
) -> None:
    """A pod's console (its newest restart attempt); each rank's own log is in the run
    dir (logs/rank_<k>.log)."""
    from dtrain_cli.launch.k8s import api

    kc = _cluster(context, namespace)
    try:
        found = api.pods(kc, name, rank)
        if not found:
            raise api.KubeError(
                f"no pod of node rank {rank} for {name} in namespace {kc.namespace}"
            )
        api.write_logs(kc, found[-1]["metadata"]["name"], follow, _write)
    except api.KubeError as err:
        fail([str(err)], err.code)


@k8s_app.command()
def cancel(
    name: str = typer.Argument(..., help="The run name."),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help=NAMESPACE_HELP),
    context: str | None = typer.Option(None, "--context", help=CONTEXT_HELP),
) -> None:
    """Delete the run's JobSet (its pods) and ConfigMap; the run dir on the volume stays."""
    from dtrain_cli.launch.k8s import api

    kc = _cluster(context, namespace)
    try:
        done = api.cancel(kc, name)
    except api.KubeError as err:
        fail([str(err)], err.code)
    print(f"deleted {' and '.join(done)}")
