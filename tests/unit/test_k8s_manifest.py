"""``dtrain k8s``'s manifest: golden files, every document valid against the official
schemas (and a wrong one refused), the fields that carry the plan, the grace period.
No cluster needed (tests/k8s_schema.py says how strict the schema check is).

Regenerate the golden files after a deliberate change, then review the diff by hand:
    DTRAIN_UPDATE_GOLDEN=1 python -m pytest -q tests/unit/test_k8s_manifest.py
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from dtrain_cli.cli.k8s_cmd import build
from dtrain_cli.launch.k8s.job import CONFIG_MOUNT, K8sJob
from dtrain_cli.launch.k8s.render import documents, render_manifest
from dtrain_cli.plan.plan import Plan
from tests.k8s_schema import problems, vendored

GOLDEN = Path(__file__).parents[1] / "golden"
IMAGE = "cluster.image=registry.example/team/train:1.0"
PINNED = ["train.steps=100", "train.global_batch_size=16", "train.micro_batch_size=4"]
VARIANTS = {
    "single": ["recipe=gpt_tiny", IMAGE, "run.name=tiny-1", *PINNED],
    "multi_gpu": [
        "recipe=gpt_small",
        IMAGE,
        "run.name=gpt-small-4x8",
        "parallel.nnodes=4",
        "cluster.gpus_per_node=8",
        "cluster.pvc=train-runs",
        "cluster.cpus_per_task=64",
        "cluster.mem=480G",
        "cluster.shm_size=64Gi",
        "hardware=h100_80g",
        "launcher.max_restarts=3",
        "+cluster.env.NCCL_DEBUG=WARN",
        "train.steps=1000",
        "train.global_batch_size=256",
        "train.micro_batch_size=8",
    ],
    "queue": [
        "recipe=gpt_tiny",
        IMAGE,
        "run.name=tiny-queued",
        "parallel.nnodes=2",
        "dp=4",
        "cluster.pvc=train-runs",
        "cluster.queue=team-a",
        "cluster.namespace=team-a",
        *PINNED,
    ],
    "pvc": [
        "recipe=gpt_tiny",
        IMAGE,
        "run.name=tiny-pvc",
        "parallel.nnodes=2",
        "dp=4",
        "cluster.pvc=train-runs",
        "cluster.run_root=/mnt/runs",
        "cluster.service_account=trainer",
        "launcher.max_restarts=2",
        *PINNED,
    ],
    "elastic": [
        "recipe=gpt_tiny",
        IMAGE,
        "run.name=tiny-elastic",
        "parallel.nnodes=1:2",
        "dp=4",
        "cluster.pvc=train-runs",
        "launcher.max_restarts=5",
        *PINNED,
    ],
    "trainjob": [
        "recipe=gpt_tiny",
        IMAGE,
        "run.name=tiny-trainjob",
        "parallel.nnodes=2",
        "dp=4",
        "cluster.k8s_kind=trainjob",
        "cluster.pvc=train-runs",
        "cluster.queue=team-a",
        *PINNED,
    ],
}


def built(name: str) -> tuple[Plan, K8sJob]:
    _, plan, job = build(VARIANTS[name], [])
    return plan, job


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_golden_manifests(name):
    text = render_manifest(built(name)[1])
    path = GOLDEN / f"k8s_{name}.yaml"
    if os.environ.get("DTRAIN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (DTRAIN_UPDATE_GOLDEN=1 rewrites it)"
    assert render_manifest(built(name)[1]) == text  # pure: same input, same bytes


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_golden_document_is_valid_against_the_official_schemas(name):
    docs = list(yaml.safe_load_all((GOLDEN / f"k8s_{name}.yaml").read_text()))
    assert [d["kind"] for d in docs] == [
        "ConfigMap",
        "TrainJob" if name == "trainjob" else "JobSet",
    ]
    for doc in docs:
        assert problems(doc) == [], doc["kind"]


def test_the_vendored_schemas_say_where_they_come_from():
    js = vendored("jobset.x-k8s.io/v1alpha2", "JobSet")
    tj = vendored("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert (js["repository"], js["tag"]) == ("kubernetes-sigs/jobset", "v0.12.0")
    assert (tj["repository"], tj["tag"]) == ("kubeflow/trainer", "v2.3.0")
    assert len(js["commit"]) == len(tj["commit"]) == 40


def _jobset():
    return yaml.safe_load_all((GOLDEN / "k8s_multi_gpu.yaml").read_text())


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["spec", "failurePolicy", "maxRestart"], 3, "'maxRestart' was unexpected"),
        (["spec", "failurePolicy", "maxRestarts"], "3", "is not of type 'integer'"),
        (["spec", "successPolicy", "operator"], "Every", "is not one of"),
        (["spec", "network", "enableDNSHostname"], True, "'enableDNSHostname' was unexpected"),
        (["metadata", "label"], {}, "'label' was unexpected"),
    ],
)
def test_a_misspelt_field_or_a_wrong_type_fails_the_jobset_schema(path, value, message):
    _, js = _jobset()
    node = js
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    found = problems(js)
    assert found and any(message in p for p in found), found


def test_a_wrong_pod_field_fails_both_the_crd_and_the_builtin_job_schema():
    _, js = _jobset()
    container = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    container["containers"][0]["volumeMount"] = container["containers"][0].pop("volumeMounts")
    found = problems(js)
    assert any(p.startswith("JobSet ") and "volumeMount" in p for p in found)
    assert any(p.startswith("Job ") and "volumeMount" in p for p in found)  # kubernetes-validate
    _, js = _jobset()
    volumes = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"]
    volumes[2]["emptyDir"]["sizeLimit"] = 1.5  # int-or-string: a float is neither
    assert any("sizeLimit" in p for p in problems(js))


def test_a_wrong_trainjob_and_configmap_fail():
    cm, tj = yaml.safe_load_all((GOLDEN / "k8s_trainjob.yaml").read_text())
    bad = copy.deepcopy(tj)
    bad["spec"]["trainer"]["numNode"] = bad["spec"]["trainer"].pop("numNodes")
    assert any("'numNode' was unexpected" in p for p in problems(bad))
    bad = copy.deepcopy(tj)
    bad["spec"]["trainer"]["numProcPerNode"] = "8"
    assert any("numProcPerNode" in p for p in problems(bad))
    cm["data"]["plan.yaml"] = 3
    assert any("is not of type" in p for p in problems(cm))


def test_the_pods_run_the_agent_on_the_plan_the_user_saw():
    plan, job = built("multi_gpu")
    cm, js = documents(job)
    assert Plan.from_dict(yaml.safe_load(cm["data"]["plan.yaml"])) == plan
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["run"]["root"] == "/runs" and config["run"]["name"] == "gpt-small-4x8"
    assert config["run"]["import_roots"] == []  # this machine's paths mean nothing in a pod
    rjob = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert rjob["parallelism"] == rjob["completions"] == 4
    assert rjob["completionMode"] == "Indexed" and rjob["backoffLimit"] == 0
    pod = rjob["template"]["spec"]
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["python", "-m", "dtrain_cli"]
    assert ctr["args"] == [
        "agent",
        "/runs/gpt-small-4x8",
        "--nnodes",
        "4",
        "--node-rank",
        "$(NODE_RANK)",
        "--rdzv-endpoint",
        "gpt-small-4x8-node-0-0.gpt-small-4x8:29500",
        "--rdzv-id",
        "gpt-small-4x8-$(RESTART_ATTEMPT)",
        "--init-from",
        CONFIG_MOUNT,
    ]
    env = {e["name"]: e for e in ctr["env"]}
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env["NCCL_DEBUG"]["value"] == "WARN"
    assert ctr["resources"]["limits"] == {"nvidia.com/gpu": 8, "memory": "480Gi"}
    assert ctr["resources"]["requests"]["cpu"] == 64
    assert pod["volumes"][2] == {
        "name": "dshm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"},
    }
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 3 == plan.max_restarts
    assert js["spec"]["successPolicy"] == {"operator": "All"}
    assert plan.nproc_per_node == 8 and plan.world_size == 32 and plan.device == "cuda"


def test_queue_label_pvc_and_elastic_range():
    _, queued = documents(built("queue")[1])
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert queued["metadata"]["namespace"] == "team-a"
    _, js = documents(built("pvc")[1])
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert {"name": "runs", "persistentVolumeClaim": {"claimName": "train-runs"}} in pod["volumes"]
    assert pod["containers"][0]["args"][1] == "/mnt/runs/tiny-pvc"
    assert pod["serviceAccountName"] == "trainer"
    _, js = documents(built("elastic")[1])
    spec = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert spec["parallelism"] == 2 and spec["backoffLimit"] == 1  # MAX pods, MAX-MIN losses
    assert spec["template"]["spec"]["containers"][0]["args"][2:4] == ["--nnodes", "1:2"]


def test_one_node_needs_no_rendezvous_endpoint():
    _, js = documents(built("single")[1])
    ctr = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert ctr["args"] == ["agent", "/runs/tiny-1", "--nnodes", "1", "--init-from", CONFIG_MOUNT]
    assert "ports" not in ctr


def test_grace_period_follows_the_checkpoint_estimate():
    """Bigger checkpoints or slower storage or steps -> a longer grace; the agent's own
    deadline for its workers stays inside it."""
    base = ["recipe=gpt_small", IMAGE, "run.name=g", "hardware=h100_80g"]
    grace = {}
    for label, extra in {
        "fast": [],
        "slow_disk": ["cluster.storage_gbps=0.01"],
        "rare_logging": ["logging.every=1000"],
        "set": ["cluster.grace_period_s=600"],
    }.items():
        grace[label] = build([*base, *extra], [])[2].grace_period_s
    # gpt_small: 14.5 M params x 12 bytes (weights + AdamW) = 174 MB: 17 s at 10 MB/s
    assert grace["slow_disk"] - grace["fast"] >= 16
    assert grace["rare_logging"] > grace["fast"] >= 30 and grace["set"] == 600
    _, js = documents(build([*base, "cluster.grace_period_s=600"], [])[2])
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 600
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "595"


def test_the_trainjob_flavour_uses_the_runtime_s_variables():
    _, tj = documents(built("trainjob")[1])
    trainer = tj["spec"]["trainer"]
    assert tj["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 2
    assert "$(PET_NODE_RANK)" in trainer["args"]
    assert "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)" in trainer["args"]
    (patch,) = tj["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    assert pod["spec"]["template"]["spec"]["containers"][0]["name"] == "node"


SITE_POD = "cluster.pod_spec={tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}], nodeSelector: {pool: gpu}, priorityClassName: high, imagePullSecrets: [{name: registry}]}"  # noqa: E501
SITE_CONTAINER = "cluster.container_spec={securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}, envFrom: [{secretRef: {name: wandb}}]}"  # noqa: E501


@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
def test_a_site_s_pod_and_container_fields_reach_every_pod(kind):
    """Tolerations for tainted GPU nodes, a node pool, a registry secret, a restricted
    security context, secrets as variables: a platform engineer's pods need them, and
    dtrain had no key for any (only editing --out's file, which rules out --submit)."""
    pod_only = SITE_POD.replace(", priorityClassName: high", "")  # a TrainJob patch lacks it
    site = (
        [SITE_POD, SITE_CONTAINER]
        if kind == "jobset"
        else [pod_only, SITE_CONTAINER.split(", envFrom")[0] + "}"]
    )
    args = ["recipe=gpt_tiny", IMAGE, "run.name=site", f"cluster.k8s_kind={kind}", *site]
    _, _, job = build(args, [])
    docs = list(documents(job))
    for doc in docs:
        assert problems(doc) == [], doc["kind"]
    body = docs[1]["spec"]
    if kind == "jobset":
        pod = body["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == "high" and pod["containers"][0]["envFrom"]
    else:
        rjob = body["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        pod = rjob["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["nodeSelector"] == {
        "pool": "gpu"
    }
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["volumes"] and pod["containers"][0]["volumeMounts"]  # dtrain's own kept
