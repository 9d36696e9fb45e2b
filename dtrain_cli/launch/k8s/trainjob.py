"""The Kubeflow Trainer v2 flavour (``cluster.k8s_kind=trainjob``): a TrainJob on a
ClusterTrainingRuntime (``cluster.trainjob_runtime``, default ``torch-distributed``), for
platforms that expose only Trainer runtimes. Pure and torch-free.

    dtrain k8s recipe=gpt_tiny parallel.nnodes=2 cluster.image=train:1.0 \\
        cluster.k8s_kind=trainjob --dry-run

The runtime builds the JobSet (its replicated job and container are both named ``node``)
and gives the trainer container ``PET_NODE_RANK`` (the completion index),
``PET_MASTER_ADDR`` (pod 0's DNS name) and ``PET_MASTER_PORT``: the same ``dtrain agent``
command takes them through Kubernetes' ``$(VAR)`` expansion. The ConfigMap, the run volume,
/dev/shm and the grace period go in through ``runtimePatches`` (Trainer >= v2.2, validated
against v2.3.0's CRD). The runtime owns the restart policy (``failurePolicy``) and the
Job's settings: ``launcher.max_restarts`` cannot be expressed here.
"""

from __future__ import annotations

from typing import Any

from dtrain_cli.launch.k8s.job import (
    QUEUE_LABEL,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
    TRAINJOB_API,
    K8sJob,
    agent_args,
)
from dtrain_cli.launch.k8s.manifest import (
    container_env,
    metadata,
    resources,
    volume_mounts,
    volumes,
)

PATCH_MANAGER = "dtrain"
"""Who owns the runtime patch (Trainer keys patches by manager)."""


def trainjob(job: K8sJob) -> dict[str, Any]:
    group, version, _ = TRAINJOB_API
    queue = {QUEUE_LABEL: job.cluster.queue} if job.cluster.queue else {}
    restart = [
        {"name": "RESTART_ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": RESTART_ATTEMPT}}}
    ]
    args = agent_args(
        job,
        "$(PET_NODE_RANK)",
        "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
        f"{job.name}-$(RESTART_ATTEMPT)",
    )
    trainer: dict[str, Any] = {
        "image": job.image,
        "command": [job.python, "-m", "dtrain_cli"],
        "args": args,
        "env": container_env(job, restart if job.nnodes > 1 else []),
        "numNodes": job.nnodes,
        "numProcPerNode": job.nproc_per_node,
    }
    if res := resources(job):
        trainer["resourcesPerNode"] = res
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": job.grace_period_s}
    if job.cluster.service_account:
        pod["serviceAccountName"] = job.cluster.service_account
    container = {"name": REPLICATED_JOB, "volumeMounts": volume_mounts(job)}
    pod["containers"] = [{**container, **job.cluster.container_spec}]
    pod["volumes"] = volumes(job)
    pod.update(job.cluster.pod_spec)  # its keys are not dtrain's: checked
    patch = {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": REPLICATED_JOB, "template": {"spec": {"template": {"spec": pod}}}}
                    ]
                }
            }
        },
    }
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "TrainJob",
        "metadata": metadata(job, job.name, queue),
        "spec": {
            "runtimeRef": {"name": job.cluster.trainjob_runtime},
            "trainer": trainer,
            "runtimePatches": [patch],
        },
    }
