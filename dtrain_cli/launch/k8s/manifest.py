"""The manifest: a ConfigMap with the run's config and plan, and the JobSet that runs it.
Pure and torch-free: the same job gives the same bytes (golden-file tested).

    dtrain k8s recipe=gpt_tiny parallel.nnodes=2 cluster.image=train:1.0 --dry-run

One replicated job of ``nnodes`` indexed pods (``parallelism = completions = nnodes``,
``completionMode: Indexed``), DNS hostnames on. Failures: the Job fails at its first failed
pod (``backoffLimit: 0``; elastic runs tolerate MAX-MIN lost pods, which the Job replaces
and which rejoin) and the JobSet restarts the whole group up to ``launcher.max_restarts``
times (``restartStrategy: BlockingRecreate``: the old pods are gone before the new ones
start); a preemption (a pod that exits 75 with its checkpoint saved, or one the cluster
disrupts) fails the Job through its ``podFailurePolicy`` and restarts the group without
counting against ``maxRestarts``, as a SLURM requeue does; bad input (exit 2: a config, a
claim that holds another run of that name) fails the JobSet at once. Every restart resumes
from the run dir's newest complete checkpoint.
"""

from __future__ import annotations

from typing import Any

from dtrain_cli.launch.k8s.job import (
    AGENT_EXIT_S,
    COMPLETION_INDEX,
    CONFIG_MOUNT,
    JOBSET_API,
    QUEUE_LABEL,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
    K8sJob,
    agent_args,
)
from dtrain_cli.rundir.protocol import EXIT_CONFIG, EXIT_PREEMPTED

RUN_VOLUME, FILES_VOLUME, SHM_VOLUME = "runs", "rundir-files", "dshm"
SLURM_MEMORY_UNITS = {"K": "Ki", "M": "Mi", "G": "Gi", "T": "Ti", "": "Mi"}


def labels(job: K8sJob) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "dtrain", "app.kubernetes.io/instance": job.name}


def metadata(job: K8sJob, name: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if job.cluster.namespace:
        meta["namespace"] = job.cluster.namespace
    meta["labels"] = {**labels(job), **(extra or {})}
    return meta


def configmap(job: K8sJob) -> dict[str, Any]:
    """config.yaml and plan.yaml: every pod runs exactly the plan the user saw."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, job.configmap_name),
        "data": dict(job.files),
    }


def resources(job: K8sJob) -> dict[str, Any]:
    """GPUs (requests = limits, as extended resources must be), CPUs, memory (SLURM's
    ``cluster.mem`` units are binary: 200G -> 200Gi)."""
    c = job.cluster
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if job.gpus_per_node:
        limits[c.gpu_resource] = requests[c.gpu_resource] = job.gpus_per_node
    if c.cpus_per_task:
        requests["cpu"] = c.cpus_per_task
    if c.mem:
        memory = c.mem.rstrip("KMGT") + SLURM_MEMORY_UNITS[c.mem[-1] if c.mem[-1] in "KMGT" else ""]
        limits["memory"] = requests["memory"] = memory
    return {key: value for key, value in (("limits", limits), ("requests", requests)) if value}


def container_env(job: K8sJob, rank_env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The downward-API variables ``rank_env``, the agent's shutdown deadline, and
    ``cluster.env``."""
    shutdown = max(1, job.grace_period_s - AGENT_EXIT_S)  # then the agent SIGKILLs workers
    env = [*rank_env, {"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(shutdown)}]
    return env + [{"name": k, "value": v} for k, v in sorted(job.cluster.env.items())]


def volume_mounts(job: K8sJob) -> list[dict[str, Any]]:
    return [
        {"name": FILES_VOLUME, "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": RUN_VOLUME, "mountPath": job.cluster.run_root},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
    ]


def volumes(job: K8sJob) -> list[dict[str, Any]]:
    c = job.cluster
    run_volume: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": c.pvc}} if c.pvc else {"emptyDir": {}}
    )
    shm: dict[str, Any] = {"medium": "Memory"}
    if c.shm_size:
        shm["sizeLimit"] = c.shm_size
    return [
        {"name": FILES_VOLUME, "configMap": {"name": job.configmap_name}},
        {"name": RUN_VOLUME, **run_volume},
        {"name": SHM_VOLUME, "emptyDir": shm},
    ]


def rank_env() -> list[dict[str, Any]]:
    """Node rank from the Job's completion index; the JobSet's restart attempt (a fresh
    rendezvous id per attempt)."""
    return [
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": "RESTART_ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": RESTART_ATTEMPT}}},
    ]


def container(job: K8sJob) -> dict[str, Any]:
    endpoint = f"{job.rendezvous_host}:{job.port}"
    args = agent_args(job, "$(NODE_RANK)", endpoint, f"{job.name}-$(RESTART_ATTEMPT)")
    spec: dict[str, Any] = {
        "name": REPLICATED_JOB,
        "image": job.image,
        "command": [job.python, "-m", "dtrain_cli"],
        "args": args,
        "env": container_env(job, rank_env() if job.nnodes > 1 else []),
    }
    if job.nnodes > 1:
        spec["ports"] = [{"name": "rendezvous", "containerPort": job.port}]
    if res := resources(job):
        spec["resources"] = res
    spec["volumeMounts"] = volume_mounts(job)
    return {**spec, **job.cluster.container_spec}  # its keys are not dtrain's: checked


def pod_spec(job: K8sJob) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the JobSet restarts the group; podFailurePolicy needs it
        "terminationGracePeriodSeconds": job.grace_period_s,
    }
    if job.cluster.service_account:
        spec["serviceAccountName"] = job.cluster.service_account
    spec["containers"] = [container(job)]
    spec["volumes"] = volumes(job)
    return {**spec, **job.cluster.pod_spec}  # its keys are not dtrain's: checked


CONFIG_ERROR_MESSAGE = f"failed with exit code {EXIT_CONFIG} matching FailJob rule at index 0"
"""The Job controller's message for the podFailurePolicy rule of exit code 2 (its first):
"Container node for pod NS/POD failed with exit code 2 matching FailJob rule at index 0"
(kubernetes pkg/controller/job/pod_failure_policy.go), which a JobSet rule matches."""


def job_spec(job: K8sJob) -> dict[str, Any]:
    """The indexed Job every replica of the one replicated job runs."""
    preempted = [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": REPLICATED_JOB, "operator": "In", "values": [code]},
        }
        for code in (EXIT_CONFIG, EXIT_PREEMPTED)  # the rule's index is in the Job's message
    ]
    preempted.append(
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    )
    return {
        "parallelism": job.nnodes,
        "completions": job.nnodes,
        "completionMode": "Indexed",
        "backoffLimit": job.nnodes - job.min_nnodes if job.min_nnodes is not None else 0,
        "podFailurePolicy": {"rules": preempted},
        "template": {"metadata": {"labels": labels(job)}, "spec": pod_spec(job)},
    }


def jobset(job: K8sJob) -> dict[str, Any]:
    group, version, _ = JOBSET_API
    queue = {QUEUE_LABEL: job.cluster.queue} if job.cluster.queue else {}
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "JobSet",
        "metadata": metadata(job, job.name, queue),
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All"},
            "failurePolicy": {
                "maxRestarts": job.max_restarts,
                "restartStrategy": "BlockingRecreate",
                "rules": [
                    {  # bad input (exit 2) fails the same way again: not retried
                        "name": "config-error",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                        "onJobFailureMessagePatterns": [CONFIG_ERROR_MESSAGE],
                    },
                    {
                        "name": "preemption",
                        "action": "RestartJobSetAndIgnoreMaxRestarts",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    },
                ],
            },
            "replicatedJobs": [
                {"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec(job)}}
            ],
        },
    }
