"""The manifest trains: its pods replayed here (tests/kube_local.py) with the command and
environment the manifest gives them rendezvous, train the same loss curve as ``dtrain
launch`` of the same plan, and recover from a lost pod as ``failurePolicy`` promises.

2 pods x 2 processes, gloo, gpt_tiny on a small synthetic corpus, 12 steps.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dtrain_cli.cli.k8s_cmd import build
from dtrain_cli.launch.k8s.render import render_manifest
from tests.conftest import Run, cache_dir, run_dtrain
from tests.kube_local import KubeLocal

pytestmark = pytest.mark.multiproc

MATH = [
    "recipe=gpt_tiny",
    "data=synthetic",
    "data.synthetic_tokens=20000",
    "train.steps=12",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "logging.every=1",
    "checkpoint.every_steps=4",
    "train.eval_every=0",
    "optim.warmup_steps=2",
    "logging.tensorboard=false",
    "debug.replica_check_at_end=true",  # param_digest
    "launcher.threads_per_proc=1",
    "dp=4",
]
POD = [
    "parallel.nnodes=2",
    "cluster.image=registry.example/team/train:1.0",
    "cluster.pvc=runs",
    "launcher.max_restarts=1",
    "cluster.grace_period_s=20",
]


def image_env(root: Path, **extra: str) -> dict[str, str]:
    """The image: its PATH has the Python with dtrain as ``python``."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(root / "home"),
        "DTRAIN_CACHE": str(cache_dir()),
        **extra,
    }
    if "PYTHONPATH" in os.environ:  # a checkout run without installing it
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def replay(tmp_path: Path, name: str, **env: str) -> tuple[KubeLocal, Path]:
    _, _, job = build([*MATH, *POD, f"run.name={name}"], [])
    cluster = KubeLocal(render_manifest(job), tmp_path, image_env(tmp_path, **env))
    return cluster, tmp_path / "pvc" / "runs" / name


def pods_run(run_dir: Path) -> Run:
    return Run([], 0, "", "", run_dir)


def losses(run: Run) -> list[float]:
    return [r["loss"] for r in run.metrics()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Run:
    run = run_dtrain(["launch", *MATH], tmp_path_factory.mktemp("k8s-reference"))
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def tail(paths: list[Path]) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for p in paths if p.exists())


def test_two_pods_rendezvous_and_train_the_curve_of_dtrain_launch(reference, tmp_path):
    cluster, run_dir = replay(tmp_path, "replay-2x2")
    result = cluster.run(timeout=240)
    assert result.state == "Completed", tail(result.logs)
    assert result.restarts == 0 and result.exits == [{0: 0, 1: 0}]
    pods = pods_run(run_dir)
    assert [r["step"] for r in pods.metrics()] == list(range(1, 13))
    assert losses(pods) == pytest.approx(losses(reference), rel=1e-6)
    summary = pods.summary()
    assert summary["world_size"] == 4 and summary["replicas_identical"] is True
    assert summary["param_digest"] == reference.summary()["param_digest"]
    # every pod ran the ConfigMap's plan: node 1's agent logged into the shared run dir
    assert (run_dir / "plan.yaml").read_text() == (
        tmp_path / "configmaps" / "replay-2x2-rundir" / "plan.yaml"
    ).read_text()
    assert (run_dir / "logs" / "rank_3.log").is_file()  # node 1's ranks wrote there too


def test_a_lost_pod_restarts_the_group_which_resumes_from_its_checkpoint(reference, tmp_path):
    """Pod 1's container is SIGKILLed after the step-8 checkpoint: its Job fails
    (backoffLimit 0), the JobSet restarts both pods (restart attempt 1, one of maxRestarts
    1), and the new pods resume from step 8: steps 9.. are redone, the final numbers
    are those of the uninterrupted run."""
    cluster, run_dir = replay(tmp_path, "replay-kill", DTRAIN_FAULTS="throttle:ms=250")
    latest = run_dir / "checkpoints" / "latest"
    killed: dict[str, object] = {}

    def chaos(c: KubeLocal) -> None:
        if c.attempt == 0 and not killed and latest.exists():
            step = latest.read_text().strip()
            if step == "step_000008":
                killed["at"] = step
                c.kill(1)

    result = cluster.run(timeout=300, chaos=chaos)
    assert killed == {"at": "step_000008"}, tail(result.logs)
    assert result.state == "Completed", tail(result.logs)
    assert (result.restarts, result.restarts_counted) == (1, 1)
    assert result.exits[0][1] == -9 and result.exits[1] == {0: 0, 1: 0}
    pods = pods_run(run_dir)
    summary = pods.summary()
    assert summary["resumed_from"] == "step_000008"
    assert [r["step"] for r in pods.metrics()] == list(range(1, 13))
    assert losses(pods) == pytest.approx(losses(reference), rel=1e-6)
    # to rounding, not bitwise: with 4 ranks a restarted group's gradient all-reduce need
    # not add in the same order (the losses above agree; a grad norm differs in its last bit)
    assert summary["param_sum"] == pytest.approx(reference.summary()["param_sum"], rel=1e-6)
    # the second attempt's agents met under a new rendezvous id (restart-attempt 1)
    argv, _ = cluster.argv(0)
    assert argv[argv.index("--rdzv-id") + 1] == "replay-kill-1"
    first, second = (tmp_path / f"attempt-{a}" / "pod-0.log" for a in (0, 1))
    assert "stopped by SIGTERM" in first.read_text()  # the JobSet deleted the survivor
    assert "resumed from" in second.read_text() and "Traceback" not in second.read_text()


def test_a_second_lost_pod_exceeds_max_restarts_and_fails_the_jobset(tmp_path):
    """maxRestarts=1: the first loss restarts, the second fails the JobSet (no third try)."""
    cluster, run_dir = replay(tmp_path, "replay-fail", DTRAIN_FAULTS="throttle:ms=250")

    def chaos(c: KubeLocal) -> None:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and c.pods[1].proc.poll() is None and c.pods[1].attempt == c.attempt:
            lines = metrics.read_text().splitlines()
            if lines and json.loads(lines[-1]).get("step", 0) >= 3:
                c.kill(1)

    result = cluster.run(timeout=300, chaos=chaos)
    assert result.state == "Failed" and (result.restarts, result.restarts_counted) == (1, 1)
    assert len(result.exits) == 2 and all(e[1] == -9 for e in result.exits)


def test_a_deleted_pod_is_a_preemption_checkpointed_within_its_grace_period(reference, tmp_path):
    """The cluster deletes pod 1 (an eviction): SIGTERM to its main process, the agent. It
    stops its workers with it; every rank stops at the next logging step with a checkpoint
    and pod 1 exits 75. Its Job fails through the podFailurePolicy, so the JobSet restarts
    without using one of maxRestarts. Pod 0's agent, its workers done, waits for pod 1's at
    torch's exit barrier; the restart's SIGTERM ends it there (75 too), not the grace
    period's SIGKILL 20 s later. The new pods resume from the preemption's checkpoint: no
    step is redone."""
    cluster, run_dir = replay(tmp_path, "replay-evict", DTRAIN_FAULTS="throttle:ms=250")
    metrics = run_dir / "metrics.jsonl"
    deleted: dict[str, int] = {}

    def chaos(c: KubeLocal) -> None:
        if c.attempt == 0 and not deleted and metrics.exists():
            lines = [json.loads(x) for x in metrics.read_text().splitlines()]
            steps = [r["step"] for r in lines if r["kind"] == "train"]
            if steps and steps[-1] >= 5:
                deleted["after"] = steps[-1]
                c.delete(1)

    result = cluster.run(timeout=300, chaos=chaos)
    assert result.state == "Completed", tail(result.logs)
    assert (result.restarts, result.restarts_counted) == (1, 0)  # preemption: not counted
    assert result.exits[0] == {1: 75, 0: 75}, tail(result.logs)
    for pod in (0, 1):
        log = (tmp_path / "attempt-0" / f"pod-{pod}.log").read_text()
        assert "preempted: checkpoint saved at step" in log, log[-2000:]
    summary = pods_run(run_dir).summary()
    saved = int(summary["resumed_from"].removeprefix("step_"))
    assert deleted["after"] <= saved <= deleted["after"] + 2  # the next logging step
    assert saved not in (4, 8)  # not a periodic checkpoint: the preemption's own
    assert [r["step"] for r in pods_run(run_dir).metrics()] == list(range(1, 13))
    assert losses(pods_run(run_dir)) == pytest.approx(losses(reference), rel=1e-6)


def test_bad_input_fails_the_jobset_without_a_retry(tmp_path):
    """The claim already holds another run of that name: every pod's agent says so and
    exits 2. A retry fails the same way, so the JobSet fails at once (it was restarted up
    to maxRestarts times, each a rescheduling and an image pull: a platform engineer's
    find)."""
    cluster, run_dir = replay(tmp_path, "replay-taken")
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run: {name: replay-taken}\ntrain: {steps: 99}\n")
    (run_dir / "plan.yaml").write_text("world_size: 1\n")
    result = cluster.run(timeout=120)
    assert result.state == "Failed" and result.restarts == 0, tail(result.logs)
    assert result.exits == [{0: 2, 1: 2}], tail(result.logs)
    assert "holds another run" in tail(result.logs)
