"""``dtrain k8s --submit``, ``status``, ``logs`` and ``cancel`` through the real
``kubernetes`` client against a fake API server on 127.0.0.1 (tests/kube_fake.py) that a
kubeconfig points at: what is created, in which order, what a failure leaves behind."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from tests.kube_fake import FakeKube

runner = CliRunner()
JOB = [
    "k8s",
    "recipe=gpt_tiny",
    "parallel.nnodes=2",
    "dp=4",
    "cluster.image=registry.example/team/train:1.0",
    "cluster.pvc=runs",
    "run.name=t1",
]
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets"
CONFIGMAPS = "/api/v1/namespaces/team-a/configmaps"


@pytest.fixture
def kube(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not the in-cluster path
    with FakeKube() as fake:
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
        yield fake


def one_line_error(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    return line


def test_submit_creates_the_configmap_then_the_jobset_which_owns_it(kube):
    result = runner.invoke(app, [*JOB, "--submit", "--no-follow"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == "t1"
    assert kube.requests[:3] == [
        ("POST", CONFIGMAPS),
        ("POST", JOBSETS),
        ("PATCH", f"{CONFIGMAPS}/t1-rundir"),
    ]
    # a JobSet CRD older than the manifest refuses what it does not know (422), rather than
    # dropping the failure rule that tells a config error from a preemption (a review's find)
    assert kube.queries[1].get("fieldValidation") == ["Strict"]
    jobset, configmap = kube.get("jobsets", "t1"), kube.get("configmaps", "t1-rundir")
    assert jobset["metadata"]["namespace"] == "team-a"  # the kube-context's namespace
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "name": "t1",
        "uid": jobset["metadata"]["uid"],
    }
    assert "plan.yaml" in configmap["data"]


def test_a_failing_jobset_create_deletes_the_configmap(kube):
    kube.fail["jobsets"] = (404, "the server could not find the requested resource")
    line = one_line_error(runner.invoke(app, [*JOB, "--submit"]))
    assert "JobSet t1: the server could not find the requested resource (HTTP 404)" in line
    assert "is the JobSet API (jobset.x-k8s.io/v1alpha2) installed" in line
    assert "ConfigMap t1-rundir deleted (nothing was left behind)" in line
    assert kube.requests == [
        ("POST", CONFIGMAPS),
        ("POST", JOBSETS),
        ("DELETE", f"{CONFIGMAPS}/t1-rundir"),
    ]
    assert kube.objects == {}


def test_a_jobset_the_server_finds_invalid_is_refused_and_nothing_is_left(kube):
    kube.fail["jobsets"] = (422, 'JobSet.jobset.x-k8s.io "t1" is invalid: spec: Forbidden')
    line = one_line_error(runner.invoke(app, [*JOB, "--submit"]))
    assert "is invalid" in line and "(HTTP 422)" in line
    assert kube.objects == {}


def test_a_taken_name_creates_nothing_and_keeps_the_other_run(kube):
    assert runner.invoke(app, [*JOB, "--submit", "--no-follow"]).exit_code == 0
    before = dict(kube.objects)
    line = one_line_error(runner.invoke(app, [*JOB, "--submit"]))
    assert "ConfigMap t1-rundir already exists in namespace team-a" in line
    assert "choose another run.name" in line
    assert kube.objects == before


def test_submit_follows_rank_0_s_logs_until_the_jobset_completes(kube):
    def controllers(fake: FakeKube, obj: dict) -> None:
        if obj["kind"] == "JobSet":
            name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
            fake.add_pod(ns, name, 0, "Succeeded", "step 1/10 loss 5.6\ndone: /runs/t1\n")
            fake.add_pod(ns, name, 1, "Succeeded", "node 1\n")
            obj["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}

    kube.on_create = controllers
    result = runner.invoke(app, [*JOB, "--submit"])
    assert result.exit_code == 0, result.output
    assert "step 1/10 loss 5.6" in result.stdout and "node 1" not in result.stdout
    assert "t1 Completed" in result.stdout


def test_a_failed_run_fails_the_follow_and_the_status(kube):
    def controllers(fake: FakeKube, obj: dict) -> None:
        fake.add_pod("team-a", "t1", 0, "Failed", "error: rank 1 failed\n")
        message = "jobset failed due to reaching max number of restarts"
        obj["status"] = {
            "restarts": 1,
            "conditions": [{"type": "Failed", "status": "True", "message": message}],
        }

    kube.on_create = controllers
    result = runner.invoke(app, [*JOB, "--submit"])
    assert result.exit_code == 1 and "error: rank 1 failed" in result.stdout
    status = runner.invoke(app, ["k8s", "status", "t1"])
    assert status.exit_code == 1
    assert status.stdout.splitlines()[:2] == [
        "JobSet t1 in namespace team-a: Failed (jobset failed due to reaching max number "
        "of restarts)",
        "  restarts: 1 of maxRestarts 0",
    ]


def test_status_logs_and_cancel(kube):
    assert runner.invoke(app, [*JOB, "--submit", "--no-follow"]).exit_code == 0
    kube.add_pod("team-a", "t1", 0, "Running", "rank 0 console\n")
    kube.add_pod("team-a", "t1", 1, "Running", "node 1 console\n")
    kube.get("jobsets", "t1")["status"] = {"restarts": 0}
    status = runner.invoke(app, ["k8s", "status", "t1"])
    assert status.exit_code == 0, status.output
    assert status.stdout.splitlines()[0] == "JobSet t1 in namespace team-a: Running"
    assert (
        "  node 1: t1-node-0-1-" in status.stdout and "Running (restart attempt 0)" in status.stdout
    )
    logs = runner.invoke(app, ["k8s", "logs", "t1", "--rank", "1"])
    assert logs.exit_code == 0 and logs.stdout == "node 1 console\n"
    line = one_line_error(runner.invoke(app, ["k8s", "logs", "t1", "--rank", "5"]))
    assert "no pod of node rank 5 for t1" in line
    cancel = runner.invoke(app, ["k8s", "cancel", "t1"])
    assert cancel.exit_code == 0, cancel.output
    assert cancel.stdout.strip() == "deleted JobSet t1"  # the ConfigMap went with its owner
    assert kube.get("jobsets", "t1") is None and kube.get("configmaps", "t1-rundir") is None
    line = one_line_error(runner.invoke(app, ["k8s", "status", "t1"]))
    assert line == "error: no JobSet or TrainJob t1 in namespace team-a"


def test_the_trainjob_flavour_is_created_as_a_trainjob(kube):
    result = runner.invoke(app, [*JOB, "cluster.k8s_kind=trainjob", "--submit", "--no-follow"])
    assert result.exit_code == 0, result.output
    assert ("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs") in (
        kube.requests
    )
    assert kube.get("trainjobs", "t1")["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert runner.invoke(app, ["k8s", "cancel", "t1", "-n", "team-a"]).exit_code == 0
    assert kube.objects == {}


def test_no_kube_context_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    line = one_line_error(runner.invoke(app, [*JOB, "--submit"]))
    assert line.startswith("error: no kube-context (")
    assert "set KUBECONFIG or ~/.kube/config" in line
    line = one_line_error(runner.invoke(app, ["k8s", "status", "t1"]))
    assert line.startswith("error: no kube-context (")


def test_an_unreachable_cluster_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    fake = FakeKube()  # never started: nothing listens on its port
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    fake.server.server_close()
    line = one_line_error(runner.invoke(app, [*JOB, "--submit"]))
    assert line.startswith(f"error: cannot reach the cluster at {fake.url} (")


def test_submit_refuses_a_layout_far_above_its_gpus_memory_unless_forced(kube):
    """A JobSet estimated at 12x its GPUs' memory is not created (its pods would wait to
    run out of memory at step 1); --force creates it."""
    gpt_1b = ["recipe=gpt_1b", "parallel.strategy=fsdp", "cluster.gpus_per_node=8"]
    too_big = [a for a in JOB if not a.startswith(("recipe=", "dp="))] + gpt_1b
    line = one_line_error(runner.invoke(app, [*too_big, "--submit", "--no-follow"]))
    assert "12.5x hardware=h100_80g's 78 GiB: not submitted" in line, line
    assert kube.requests == []
    forced = runner.invoke(app, [*too_big, "--submit", "--no-follow", "--force"])
    assert forced.exit_code == 0, forced.output
    assert kube.get("jobsets", "t1") is not None
