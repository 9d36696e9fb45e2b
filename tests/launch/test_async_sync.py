"""Issue 15: the parameter server (bounded staleness) and DiLoCo against synchronous dp.

Every comparison runs gpt_tiny with SGD in fp32 on the same global batch (8 = 2 x 4) for
8 steps, logged every step. The drills: ``slow:rank=1:factor=3`` (worker 1 three times
slower), ``kill:step=3:rank=1`` under ``launcher.max_restarts=1`` with a checkpoint every
2 steps (the group restarts from step 2 and must land on the same numbers).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import DTRAIN, REPO, Run, launch, run_dtrain

BASE = [
    "recipe=gpt_tiny",
    "dp=2",
    "optim=sgd",
    "train.steps=8",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "logging.every=1",
    "train.eval_every=0",
    "logging.progress=off",
    "checkpoint.at_end=false",
]
PS = ["sync.mode=param_server"]
SLOW = {"DTRAIN_FAULTS": "slow:rank=1:factor=3"}
KILL = {"DTRAIN_FAULTS": "kill:step=3:rank=1"}
RESTART = ["launcher.max_restarts=1", "checkpoint.every_steps=2"]
TOL = 1e-5


def launch_env(tmp_path_factory, name: str, env: dict, *overrides: str) -> Run:
    cwd = tmp_path_factory.mktemp(name)
    run = run_dtrain(["launch", *overrides], cwd, timeout=240, env=env)
    assert run.returncode == 0, f"launch failed:\n{run.stdout}\n{run.stderr}"
    return run


def losses(run: Run) -> list[float]:
    return [r["loss"] for r in run.metrics()]


def assert_same_curve(a: Run, b: Run, tol: float = TOL, same_norm: bool = True) -> None:
    la, lb = losses(a), losses(b)
    assert len(la) == len(lb) == 8
    assert max(abs(x - y) for x, y in zip(la, lb, strict=True)) < tol, (la, lb)
    # grad_norm is one quantity in every mode (the norm of the gradient stepped with)
    na, nb = ([r["grad_norm"] for r in run.metrics()] for run in (a, b))
    if same_norm:
        assert max(abs(x - y) / y for x, y in zip(na, nb, strict=True)) < tol, (na, nb)
    sa, sb = a.summary(), b.summary()
    assert abs(sa["param_sum"] - sb["param_sum"]) < tol * max(1.0, abs(sa["param_sum"]))
    assert abs(sa["param_sq_sum"] - sb["param_sq_sum"]) < tol * max(1.0, sa["param_sq_sum"])


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory) -> Run:
    return launch(tmp_path_factory, "sync", *BASE)


# -- plan and bad input (no launch) -------------------------------------------------------------
def plan_json(*overrides: str) -> dict:
    out = subprocess.run(
        [*DTRAIN, "plan", "--format", "json", *overrides], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_plan_roles_and_bytes_per_role() -> None:
    plan = plan_json("recipe=gpt_tiny", "dp=4", *PS, "sync.servers=2")
    assert plan["world_size"] == 6 and plan["nproc_per_node"] == 6
    servers = [r for r in plan["ranks"] if r["role"] == "server"]
    assert [(s["rank"], s["shard"]) for s in servers] == [(4, 0), (5, 1)]
    n = plan["estimates"]["num_params"]
    assert sum(s["params"] for s in plan["sync"]["servers"]) == n
    per_role = plan["sync"]["bytes_per_step"]
    assert per_role["worker"]["sent"] >= 4 * n  # one fp32 gradient per step
    assert per_role["server"]["sent"] >= 4 * (n // 2) * 4  # 4 workers pull its half
    dil = plan_json("recipe=gpt_tiny", "dp=4", "sync.mode=diloco", "sync.every=8")
    assert dil["world_size"] == 4
    ddp = dil["sync"]["ddp_bytes_per_step"]
    assert 0 < dil["sync"]["bytes_per_step"]["worker"]["sent"] <= ddp / 8


# -- parameter server ---------------------------------------------------------------------------
@pytest.mark.multiproc
def test_ps_staleness0_two_servers_equals_sync(sync_run, tmp_path_factory):
    run = launch(tmp_path_factory, "ps0", *BASE, *PS, "sync.servers=2")
    assert_same_curve(run, sync_run)
    ps = run.summary()["param_server"]
    assert len(ps["servers"]) == 2 and all(s["updates"] == 8 for s in ps["servers"])
    assert ps["staleness_hist_applied"] == {"0": {"0": 8}, "1": {"0": 8}}
    windows = run.metrics("staleness")
    assert len(windows) == 8 and all(w["staleness_max"] == 0 for w in windows)


AT_END = ["debug.replica_check_at_end=true"]  # the summary's replicas_identical
# a logging step's all-reduce lines the workers up again: the drills log once, at the end
QUIET = [*BASE, "logging.every=8"]


@pytest.mark.multiproc
def test_ps_staleness0_slow_worker_makes_the_other_wait(tmp_path_factory):
    run = launch_env(tmp_path_factory, "ps0slow", SLOW, *QUIET, *PS)
    ps = run.summary()["param_server"]
    assert ps["staleness_hist_applied"] == {"0": {"0": 8}, "1": {"0": 8}}
    wait0, wait1 = ps["bound_wait_s_per_worker"]  # worker 0 waits for the slow worker 1
    assert wait0 > 3 * wait1 and wait0 > 0.1, ps


@pytest.mark.multiproc
def test_ps_staleness2_bounded_under_a_slow_worker(tmp_path_factory):
    run = launch_env(tmp_path_factory, "ps2", SLOW, *QUIET, *PS, "sync.max_staleness=2", *AT_END)
    ps = run.summary()["param_server"]
    applied = ps["staleness_hist_applied"]
    seen = {int(s) for hist in applied.values() for s in hist}
    assert max(seen) <= 2 and max(seen) >= 1, applied  # asynchronous, and within the bound
    assert sum(sum(h.values()) for h in applied.values()) == 16  # every update recorded
    assert run.summary()["replicas_identical"]  # every worker ends on the final parameters
    (window,) = run.metrics("staleness")
    assert sum(sum(h) for h in window["staleness_hist"].values()) == 16
    assert window["staleness_max"] == max(seen)
    # the workers' schedulers count the LR the servers apply; torch's order check is moot
    assert "lr_scheduler.step()" not in run.stdout + run.stderr


@pytest.mark.multiproc
def test_ps_killed_worker_rejoins_and_lands_on_sync(sync_run, tmp_path_factory):
    run = launch_env(tmp_path_factory, "pskill", KILL, *BASE, *PS, *RESTART)
    assert run.summary()["resumed_from"] == "step_000002"
    assert_same_curve(run, sync_run)  # servers reseeded from the checkpoint, exactly


# -- DiLoCo -------------------------------------------------------------------------------------
@pytest.mark.multiproc
def test_diloco_every1_equals_sync(sync_run, tmp_path_factory):
    run = launch(
        tmp_path_factory,
        "dil1",
        *BASE,
        "sync.mode=diloco",
        "sync.every=1",
        "sync.outer_lr=1",
        "sync.outer_momentum=0",
    )
    assert_same_curve(run, sync_run, same_norm=False)
    # the inner optimizers step with each replica's own gradient: grad_norm is the mean of
    # their norms, never below the norm of their average (what DDP steps with)
    own, avg = ([r["grad_norm"] for r in run.metrics()] for run in (run, sync_run))
    assert all(o >= a * (1 - 1e-6) for o, a in zip(own, avg, strict=True)), (own, avg)
    assert max(o / a for o, a in zip(own, avg, strict=True)) > 1.01


DILOCO8 = [
    *BASE,
    "sync.mode=diloco",
    "sync.every=8",
    "sync.outer_lr=0.7",
    "sync.outer_momentum=0.9",
    "debug.replica_check_at_end=true",
]


@pytest.fixture(scope="module")
def diloco8(tmp_path_factory) -> Run:
    return launch(tmp_path_factory, "dil8", *DILOCO8)


@pytest.mark.multiproc
def test_diloco_every8_bytes_and_loss(sync_run, diloco8):
    s = diloco8.summary()
    ddp = sync_run.summary()["comm_bytes_per_step_estimate"]  # what a step of DDP sends
    assert 0 < s["diloco_bytes_per_step_measured"] <= ddp / 8
    assert s["diloco_outer_steps"] == 1
    # after 8 steps the loss (mean of the replicas' inner losses) stays within 2% of DDP's
    assert abs(losses(diloco8)[-1] - losses(sync_run)[-1]) < 0.02 * losses(sync_run)[-1]
    assert s["replicas_identical"]


@pytest.mark.multiproc
def test_diloco_killed_worker_resumes_exactly(diloco8, tmp_path_factory):
    run = launch_env(tmp_path_factory, "dilkill", KILL, *DILOCO8, *RESTART)
    assert run.summary()["resumed_from"] == "step_000002"
    assert_same_curve(run, diloco8)  # anchors, outer momentum and each replica restored


@pytest.mark.multiproc
def test_ps_preemption_checkpoints_and_resumes_bitwise(tmp_path_factory):
    """SIGUSR1 to dtrain: the workers agree at a logging step, pull the servers' latest
    parameters and optimizer state into a checkpoint, stop with exit 75; ``dtrain resume``
    reseeds the servers from it and lands on the uninterrupted curve, bitwise."""
    import os
    import signal
    import sys
    import time

    from tests.conftest import cache_dir

    long = [*BASE, *PS, "sync.servers=2", "train.steps=60", "logging.every=5"]
    ref = launch(tmp_path_factory, "ps-long", *long)
    cwd = tmp_path_factory.mktemp("ps-preempt")
    env = {**os.environ, "DTRAIN_CACHE": str(cache_dir()), **SLOW}  # a few seconds to signal
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtrain_cli", "launch", *long],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    metrics = list(cwd.glob("runs/*/metrics.jsonl"))
    while not (metrics and metrics[0].read_text().count("\n") >= 1):
        assert time.time() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
        metrics = list(cwd.glob("runs/*/metrics.jsonl"))
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    run_dir = metrics[0].parent
    step = json.loads((run_dir / "preempted.json").read_text())["step"]
    assert step % 5 == 0 and 5 <= step < 60, out
    resumed = run_dtrain(["resume", "--ckpt", str(run_dir)], cwd, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.summary()["resumed_from"] == f"step_{step:06d}"
    assert losses(resumed) == losses(ref)
    assert resumed.summary()["param_sum"] == ref.summary()["param_sum"]


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["diloco", "local_sgd"])
def test_replicas_with_adamw_resume_exactly_after_a_kill(tmp_path_factory, mode):
    """Replicas that step alone keep AdamW moments of their own: each is its own entry of the
    checkpoint (DCP keeps one copy of what looks replicated), so a killed run lands on the
    uninterrupted one."""
    alone = [
        *BASE,
        "optim=adamw",
        "optim.warmup_steps=0",
        f"sync.mode={mode}",
        "sync.every=4",
        "sync.warmup_steps=0",
        "checkpoint.every_steps=2",
    ]
    ref = launch(tmp_path_factory, f"{mode}-adamw", *alone)
    run = launch_env(
        tmp_path_factory, f"{mode}-adamw-kill", KILL, *alone, "launcher.max_restarts=1"
    )
    assert run.summary()["resumed_from"] == "step_000002"
    assert losses(run) == losses(ref)  # bitwise
