"""Elastic membership: the cost of losing a node, for two checkpoint cadences.

    .venv/bin/python bench/run.py --only elastic

Two `dtrain launch --nnodes 1:2` agents on this machine as nodes (one gloo worker each,
gpt_tiny, dp=2 -> dp=1 with accumulation 2). Once the pair has finished step KILL_AT, the
second node's whole process group (launcher, agent, fork server, worker) is SIGKILLed. Measured:
the time from that kill to the first step the node left finishes on its own (the
membership record's time), the steps redone, and the record's own split (old group's last
step -> new group's first). Detecting the loss takes ``launcher.node_timeout_s`` (here 5 s)
plus ``launcher.last_call_s`` (2 s) of rendezvous, then a worker start and a resharding load.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import REPO, Section, Workspace, log, markdown_table

KILL_AT = 33
STEPS = 50
CADENCES = (5, 20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(cadence: int, run_id: str, port: int) -> list[str]:
    return [
        "recipe=gpt_tiny",
        "dp=2",
        f"train.steps={STEPS}",
        "train.eval_every=0",
        "logging.tensorboard=false",
        f"checkpoint.every_steps={cadence}",
        "launcher.max_restarts=2",
        "launcher.node_timeout_s=5",
        "launcher.last_call_s=2",
        "launcher.threads_per_proc=1",
        "--nnodes",
        "1:2",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
    ]


def _one(ws: Workspace, cadence: int) -> tuple[dict, float, list[str]]:
    run_id, port = ws.next_name(f"elastic-{cadence}"), _free_port()
    base = [sys.executable, "-m", "dtrain_cli", "launch", *_args(cadence, run_id, port)]
    env = ws.env(PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [*base, "--node-rank", str(rank)],
            cwd=ws.root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    run_dir = ws.root / "runs" / run_id
    deadline = time.monotonic() + 300
    try:
        while True:
            progress = _read(run_dir / "elastic" / "progress.json")
            if progress.get("world_size") == 2 and progress.get("step", 0) >= KILL_AT:
                break
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"cadence {cadence}: the pair never reached step {KILL_AT}")
            time.sleep(0.02)
        killed_at = time.time()
        os.killpg(procs[1].pid, signal.SIGKILL)
        procs[0].wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    if procs[0].returncode != 0:
        raise RuntimeError(f"cadence {cadence}: node 0 exited {procs[0].returncode}")
    summary = json.loads((run_dir / "summary.json").read_text())
    change = next(c for c in summary["membership_changes"] if c["new_world_size"] == 1)
    shown = [
        f"cd $W; python -m dtrain_cli launch {' '.join(_args(cadence, run_id, port))} "
        f"--node-rank {r} &"
        for r in (0, 1)
    ]
    return change, change["time"] - killed_at, shown


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def elastic_bench(ws: Workspace) -> Section:
    rows, commands = [], []
    for cadence in CADENCES:
        change, loss_to_step, shown = _one(ws, cadence)
        log(f"elastic cadence {cadence}: {loss_to_step:.1f} s, {change['steps_redone']} redone")
        rows.append(
            [
                str(cadence),
                f"{change['old_last_step']} -> {change['resumed_step']}",
                str(change["steps_redone"]),
                f"{loss_to_step:.1f} s",
                f"{change['took_s']:.1f} s",
            ]
        )
        commands = shown
    table = markdown_table(
        [
            "checkpoint every",
            "last step on 2 nodes -> resumed at",
            "steps redone",
            "node lost -> first step on 1 node",
            "old group's last step -> new group's first (record)",
        ],
        rows,
    )
    return Section(
        title="Elastic membership: losing one of two nodes",
        what=(
            f"`dtrain launch recipe=gpt_tiny dp=2 --nnodes 1:2` on two agents of this machine "
            f"(one worker each); after step {KILL_AT} the second node's process group is "
            "SIGKILLed and the run finishes on one node (dp=1, accumulation 2, same curve). "
            "One round per cadence."
        ),
        table=table,
        commands=[*commands, "# then, after step 33: kill -KILL -<pgid of node 1>"],
        notes=[
            "The wait is mostly detection: the lost node's heartbeats expire after "
            "launcher.node_timeout_s=5, the rendezvous waits launcher.last_call_s=2 for more "
            "nodes, then the worker starts and loads the checkpoint resharded to dp=1.",
            "Steps redone are those since the newest complete checkpoint: at most the cadence.",
        ],
    )
