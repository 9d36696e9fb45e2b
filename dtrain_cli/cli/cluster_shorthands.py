"""What a job asks of its nodes, the same for ``dtrain sbatch`` and ``dtrain k8s``: the
cluster commands' own shorthands (on top of dtrain's ``dp=``, ``steps=`` ...) and how the
processes fill the nodes' GPUs.

    dtrain sbatch recipe=gpt_small nodes=2 gpus_per_node=8 partition=gpu time=04:00:00
    dtrain k8s    recipe=gpt_small nodes=2 gpus_per_node=8 cluster.image=IMAGE
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig
    from dtrain_cli.plan.plan import Plan

NODE_SHORTHANDS = {
    "nodes": "parallel.nnodes",
    "gpus_per_node": "cluster.gpus_per_node",
    "cpus_per_task": "cluster.cpus_per_task",
    "mem": "cluster.mem",
}
"""What every job's nodes are asked for (a pod's requests on Kubernetes)."""

SLURM_SHORTHANDS = {
    **NODE_SHORTHANDS,
    "partition": "cluster.partition",
    "account": "cluster.account",
    "qos": "cluster.qos",
    "time": "cluster.time",
}
"""``dtrain sbatch``'s: the node requests and SLURM's own #SBATCH settings."""


def words_help(shorthands: Mapping[str, str]) -> str:
    """The commands' --help line for their own words."""
    return " And the job's: " + ", ".join(f"{k}=" for k in shorthands) + "."


def expand(overrides: Sequence[str], shorthands: Mapping[str, str]) -> list[str]:
    """``nodes=2`` -> ``parallel.nnodes=2``; anything else as given."""
    out = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        out.append(f"{shorthands[key]}={value}" if sep and key in shorthands else ov)
    return out


def slurm_only(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(problems, the rest): one line per SLURM setting given to ``dtrain k8s`` by its sbatch
    shorthand, and the overrides without them (so the other problems are collected too)."""
    problems, rest = [], []
    for ov in overrides:
        key, sep, _ = ov.partition("=")
        if sep and key in SLURM_SHORTHANDS and key not in NODE_SHORTHANDS:
            problems.append(
                f"{ov}: SLURM's #SBATCH setting (dtrain sbatch); a Kubernetes job's pods are "
                "placed by cluster.queue (Kueue), cluster.namespace and the GPUs they request"
            )
        else:
            rest.append(ov)
    return problems, rest


def fill_nodes(cfg: DtrainConfig, overrides: Sequence[str]) -> None:
    """One worker per GPU of each node (``cluster.gpus_per_node``), or ``nproc_per_node=N``
    where given, and dp filling the nodes: ``nodes=2 gpus_per_node=8`` is dp=16 and
    ``nproc_per_node=4`` on those nodes dp=8. A dp given is kept as given (the plan then
    checks that it fills the nodes)."""
    keys = {ov.lstrip("+~").split("=")[0] for ov in overrides}
    par = cfg.parallel
    if keys & {"dp", "parallel.dp"}:
        return
    if not keys & {"nproc_per_node", "parallel.nproc_per_node"}:
        par.nproc_per_node = cfg.cluster.gpus_per_node
    par.dp = max(1, par.nnodes * par.nproc_per_node // (par.tp * par.pp))


def idle_gpu_problems(gpus_per_node: int, plan: Plan) -> list[str]:
    """dtrain's trainer runs one process per GPU: a node asked for more GPUs than the plan
    has processes there would leave some idle (fewer: two ranks would share one)."""
    if not gpus_per_node or plan.script is not None or plan.nproc_per_node == gpus_per_node:
        return []
    return [
        f"cluster.gpus_per_node={gpus_per_node} but the plan runs {plan.nproc_per_node} "
        "process(es) per node (dp*tp*pp / nnodes); dtrain's trainer runs one process per "
        f"GPU: set cluster.gpus_per_node={plan.nproc_per_node} or leave dp and "
        "nproc_per_node unset"
    ]
