"""The manifest file of a run: the ConfigMap, then the JobSet (:mod:`.manifest`) or the
Kubeflow TrainJob (:mod:`.trainjob`), as YAML. Pure and torch-free.

    dtrain k8s recipe=gpt_small parallel.nnodes=4 cluster.image=registry/train:1.0 --dry-run
"""

from __future__ import annotations

from typing import Any

import yaml

from dtrain_cli.launch.k8s.job import K8sJob
from dtrain_cli.launch.k8s.manifest import configmap, jobset
from dtrain_cli.launch.k8s.trainjob import trainjob


def documents(job: K8sJob) -> list[dict[str, Any]]:
    """The ConfigMap first (the pods mount it), then the JobSet or the TrainJob."""
    if job.kind == "trainjob":
        return [configmap(job), trainjob(job)]
    return [configmap(job), jobset(job)]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (config.yaml, plan.yaml) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_manifest(job: K8sJob) -> str:
    """The YAML file (``kubectl apply -f``): a comment saying what it runs, the documents."""
    from dtrain_cli.launch.slurm import comment_text

    head = [
        f"# dtrain k8s: {comment_text(job.summary)}",
        f"# kubectl apply -f FILE; dtrain k8s status {job.name}; dtrain k8s logs {job.name}",
    ]
    docs = [
        yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1_000_000) for doc in documents(job)
    ]
    return "\n".join(head) + "\n" + "".join(f"---\n{doc}" for doc in docs)
