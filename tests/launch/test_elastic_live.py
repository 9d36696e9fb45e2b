"""Elastic membership, live: `dtrain launch --nnodes 1:2` agents on this machine as nodes
(one worker each, gloo). A node is lost (its launcher's whole process group SIGKILLed), the
run goes on on one node; a node joins again, the run goes on on two; every curve and the
final parameters equal those of a run that never changed size (SGD, fp32)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import DTRAIN, Run, cache_dir, launch
from tests.launch.test_cluster_live import free_port

pytestmark = pytest.mark.multiproc

SHAPE = [
    "recipe=gpt_tiny",
    "optim=sgd",
    "model.n_layer=1",
    "model.n_embd=64",
    "model.n_head=2",
    "model.block_size=64",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "train.steps=40",
    "train.eval_every=0",
    "logging.every=1",
    "logging.tensorboard=false",
    "checkpoint.every_steps=5",
    "launcher.threads_per_proc=1",
]
ELASTIC = [
    *SHAPE,
    "dp=2",
    "launcher.max_restarts=3",
    "launcher.node_timeout_s=3",
    "launcher.last_call_s=2",
    "--nnodes",
    "1:2",
]
OUTER_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same run on one process, never resized."""
    return launch(tmp_path_factory, "elastic-ref", *SHAPE, "dp=1")


class Nodes:
    """Agents started as nodes, each the leader of its own process group."""

    def __init__(self, cwd: Path, run_id: str) -> None:
        self.cwd, self.run_id, self.port = cwd, run_id, free_port()
        self.procs: list[subprocess.Popen] = []
        self.run_dir = cwd / "runs" / run_id

    def start(self, node_rank: int, faults: str = "") -> subprocess.Popen:
        env = {**os.environ, "DTRAIN_CACHE": str(cache_dir()), "DTRAIN_FAULTS": faults}
        args = [*DTRAIN, "launch", *ELASTIC, "--node-rank", str(node_rank)]
        args += ["--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", self.run_id]
        log = open(self.cwd / f"node_{len(self.procs)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            args,
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def progress(self) -> dict:
        return progress(self.run_dir)

    def changes(self) -> list[dict]:
        return changes(self.run_dir)

    def wait_until(self, what, deadline: float, label: str, host: subprocess.Popen) -> None:
        while not what():
            if time.monotonic() > deadline:
                pytest.fail(f"{label} not within the time limit:\n{self.logs()}")
            if host.poll() is not None:
                pytest.fail(f"node 0 ended before {label}:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.cwd.glob("node_*.log")))

    def kill(self, proc: subprocess.Popen) -> None:
        """The node is lost: its launcher, agent, fork server and workers, at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for proc in self.procs:  # a group may outlive its leader: always end it
            self.kill(proc)


def progress(run_dir: Path) -> dict:
    """Rank 0's ``elastic/progress.json`` (size and last step of the group now training)."""
    try:
        return json.loads((run_dir / "elastic" / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def changes(run_dir: Path) -> list[dict]:
    """Every membership change recorded so far (``elastic/changes.jsonl``)."""
    path = run_dir / "elastic" / "changes.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def assert_same_curve(run_dir: Path, reference: Run) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    got, want = losses(run_dir), [r["loss"] for r in reference.metrics()]
    assert len(got) == len(want) == 40  # every step once: redone steps replace their records
    for step, (a, b) in enumerate(zip(got, want, strict=True), start=1):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: elastic {a} vs one size {b}"
    ref = reference.summary()
    for key in ("param_sum", "param_sq_sum"):
        assert abs(summary[key] - ref[key]) <= 1e-5 * abs(ref[key]), key
    return summary


def test_a_lost_node_the_run_finishes_on_one_with_the_same_curve(tmp_path, reference):
    nodes = Nodes(tmp_path, "shrink")
    deadline = time.monotonic() + OUTER_TIMEOUT_S
    try:
        # node 1 first: it waits for node 0's store, so both are in the first round
        second = nodes.start(1, faults="throttle:ms=100")
        first = nodes.start(0, faults="throttle:ms=100")
        on_two = lambda: (p := nodes.progress()).get("world_size") == 2 and p["step"] >= 12  # noqa: E731
        nodes.wait_until(on_two, deadline, "step 12 on two nodes", first)
        nodes.kill(second)
        first.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        nodes.close()
    assert first.returncode == 0, nodes.logs()
    summary = assert_same_curve(nodes.run_dir, reference)
    assert summary["world_size"] == 1 and summary["steps"] == 40
    *_, change = summary["membership_changes"]
    assert (change["old_world_size"], change["new_world_size"]) == (2, 1)
    assert (change["old_nnodes"], change["new_nnodes"]) == (2, 1)
    assert change["old_last_step"] >= 12 and change["resumed_step"] % 5 == 0
    assert change["steps_redone"] == change["old_last_step"] - change["resumed_step"] <= 5
    assert 0 < change["took_s"] < OUTER_TIMEOUT_S
    # issue 24 #18: the whole run's wall time, not the last membership's; the sizes it ran at
    assert [m["world_size"] for m in summary["memberships"]] == [2, 1]
    assert summary["memberships"][-1]["last_step"] == 40
    assert summary["train_wall_s"] > summary["train_wall_s_last_membership"] + change["took_s"]
    log = (nodes.run_dir / "logs" / "rank_0.log").read_text()
    assert f"{change['steps_redone']} step(s) redone" in log and "the change took" in log


def test_lost_during_a_save_then_back_resumes_the_previous_checkpoint(tmp_path, reference):
    """Node 1 dies while the step-10 checkpoint is being written: the one node left resumes
    from step 5 (the newest complete one); a third agent joins later and the run finishes
    on two nodes again."""
    nodes = Nodes(tmp_path, "regrow")
    deadline = time.monotonic() + OUTER_TIMEOUT_S
    try:
        # the group of one is slowed down until the third agent is in (its start-up takes
        # 5-30 s on a loaded machine)
        nodes.start(1, faults="kill_node_in_save:step=10")
        first = nodes.start(0, faults="throttle:ms=1500:world=1")
        shrunk = lambda: any(c["new_world_size"] == 1 for c in nodes.changes())  # noqa: E731
        nodes.wait_until(shrunk, deadline, "the group of one", first)
        third = nodes.start(1, faults="throttle:ms=1500:world=1")
        first.wait(timeout=max(1.0, deadline - time.monotonic()))
        third.wait(timeout=30)
    finally:
        nodes.close()
    assert (first.returncode, third.returncode) == (0, 0), nodes.logs()
    summary = assert_same_curve(nodes.run_dir, reference)
    assert summary["world_size"] == 2
    changes = summary["membership_changes"]
    lost = next(c for c in changes if c["new_world_size"] == 1)
    assert (lost["old_last_step"], lost["resumed_step"], lost["steps_redone"]) == (10, 5, 5)
    back = changes[-1]
    assert (back["old_world_size"], back["new_world_size"]) == (1, 2)
    assert back["resumed_step"] >= 5 and back["steps_redone"] <= 5  # the newest checkpoint
    # every checkpoint holds both nodes' files: after the join, each node's agent counted its
    # own restarts, named its own temporary folder, and rank 0 published one without rank 1's
    from dtrain_cli.checkpoint import catalog

    saved = sorted(catalog.checkpoints_dir(nodes.run_dir).glob("step_*"))
    assert saved and all(catalog.read_meta(c)["rng_ranks"] >= 1 for c in saved)
    for ckpt in saved:
        catalog.verify(ckpt)
