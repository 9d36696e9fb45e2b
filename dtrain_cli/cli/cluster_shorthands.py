"""The cluster commands' own shorthands, on top of dtrain's (``dp=``, ``steps=`` ...):
what a job asks of its nodes, the same words for ``dtrain sbatch`` and ``dtrain k8s``.

    dtrain sbatch recipe=gpt_small nodes=2 gpus_per_node=8 partition=gpu time=04:00:00
    dtrain k8s    recipe=gpt_small nodes=2 gpus_per_node=8 cluster.image=IMAGE
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
