"""Real launches through `dtrain launch` (elastic agent, gloo, CPU): the math and the outputs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dtrain_cli.plan.plan import Plan
from tests.conftest import DTRAIN, REPO, cache_dir, run_dtrain

pytestmark = pytest.mark.multiproc


def losses(run) -> list[float]:
    return [r["loss"] for r in run.metrics()]


def test_dp2_loss_curve_equals_single_process(run_dp1, run_dp2):
    one, two = losses(run_dp1), losses(run_dp2)
    assert len(one) == len(two) == 10
    for step, (a, b) in enumerate(zip(one, two, strict=True), start=1):
        assert abs(a - b) <= 1e-5 * abs(a), f"step {step}: dp=1 {a} vs dp=2 {b}"
    assert one[-1] < one[0]  # it learns


def test_dp2_replicas_identical_and_equal_to_single_process(run_dp1, run_dp2):
    s1, s2 = run_dp1.summary(), run_dp2.summary()
    assert s2["replicas_identical"] is True
    assert s2["param_sum"] == pytest.approx(s1["param_sum"], rel=1e-5)
    assert s2["param_sq_sum"] == pytest.approx(s1["param_sq_sum"], rel=1e-5)
    assert s2["val_loss"] == pytest.approx(s1["val_loss"], rel=1e-5)


def test_run_dir_holds_config_plan_and_logs(run_dp2):
    d = run_dp2.run_dir
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    assert cfg["parallel"]["dp"] == 2 and cfg["train"]["steps"] == 10
    plan = Plan.load(d / "plan.yaml")
    assert plan.world_size == 2 and plan.batch.grad_accum == 1
    for rank in (0, 1):
        text = (d / "logs" / f"rank_{rank}.log").read_text()
        coords = json.loads(re.search(r"mesh coordinates (\{.*\})", text).group(1))
        assert {"rank": rank, **coords} == plan.rank_table()[rank]  # runtime mesh == plan
    assert "step 10/10" in (d / "logs" / "rank_0.log").read_text()


def test_metrics_jsonl_and_tensorboard_agree(run_dp2):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, val = run_dp2.metrics("train"), run_dp2.metrics("val")
    assert [r["step"] for r in train] == list(range(1, 11))
    assert [r["step"] for r in val] == [5, 10]
    acc = EventAccumulator(str(run_dp2.run_dir / "tb"))
    acc.Reload()
    assert all(0 <= r["data_wait_ms"] <= r["step_time_ms"] for r in train)
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_ms", "data_wait_ms"):
        events = acc.Scalars(f"train/{key}")
        assert [e.step for e in events] == list(range(1, 11))
        for e, r in zip(events, train, strict=True):
            assert e.value == pytest.approx(r[key], rel=1e-6)
    assert [e.value for e in acc.Scalars("val/val_loss")] == pytest.approx(
        [r["val_loss"] for r in val], rel=1e-6
    )


def test_lr_follows_the_plan(run_dp2):
    plan = Plan.load(run_dp2.run_dir / "plan.yaml")
    for r in run_dp2.metrics():
        assert r["lr"] == pytest.approx(plan.lr.lr_at(r["step"] - 1))


def test_console_shows_progress_and_summary(run_dp2):
    assert "step 10/10" in run_dp2.stdout and "run summary" in run_dp2.stdout
    assert "done:" in run_dp2.stdout


def test_console_summary_fits_a_screen_and_summary_json_keeps_every_field(run_dp2):
    out = run_dp2.stdout
    block = out[out.index("run summary") : out.index("done:")].splitlines()
    assert len(block) <= 15, "\n".join(block)
    text = "\n".join(block)
    s = run_dp2.summary()
    for label, value in (
        ("final loss", f"{s['final_loss']:.4f}"),
        ("val loss", f"{s['val_loss']:.4f}"),
        ("tokens/s (steady median)", f"{s['tokens_per_s']:,.0f}"),
        ("training time", f"{s['train_wall_s']:,.1f} s (launch to the end of step 1: "),
        ("MFU (measured)", f"{s['mfu']:.0%} of the hardware profile's peak"),
    ):
        row = next(line for line in block if label in line)
        assert value in row, row
    assert f"run dir: {run_dp2.run_dir}" in block  # whole, on one line, never cut
    assert "summary.json" in text and "metrics.jsonl" in text
    assert "param_digest" not in text and "startup_" not in text
    for key in (
        "final_loss",
        "val_loss",
        "tokens_per_s",
        "train_wall_s",
        "param_sum",
        "param_sq_sum",
        "param_digest",
        "replicas_identical",
        "memory_params_bytes",
        "comm_bytes_per_step_estimate",
        "startup_phases_s",
        "startup_first_step_done_s",
        "data_wait_ms_per_step",
        "startup_peak_bytes",
    ):
        assert key in s, key
    assert s["startup_peak_bytes"]["host"] > 100 * 2**20  # torch itself is resident
    # MFU measured: the steady rate's model FLOPs over the world's peak on the CPU profile
    plan = yaml.safe_load((run_dp2.run_dir / "plan.yaml").read_text())
    peak = (
        2
        * 1e12
        * yaml.safe_load((REPO / "configs/hardware/cpu.yaml").read_text())["peak_tflops_fp32"]
    )
    flops = plan["estimates"]["flops_per_token"] * s["tokens_per_s"]
    assert s["mfu"] == pytest.approx(flops / peak, rel=1e-9), s["mfu"]


def strict_json(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_one_logging_window_measures_throughput_and_compares_with_every_step(
    run_dp1, tmp_path_factory
):
    """Issue 24 #6 and #3: the same training as run_dp1, logged once (the last step). Its
    window's throughput is measured (the warm-up step left out), summary.json is strict
    JSON; `dtrain compare` against the every-step run merges windows and agrees."""
    from tests.conftest import MATH, launch

    once = launch(tmp_path_factory, "every10", *MATH, "dp=1", "logging.every=10")
    assert [r["step"] for r in once.metrics()] == [10]
    assert once.metrics()[0]["loss_steps"] == 10
    summary = strict_json((once.run_dir / "summary.json").read_text())
    assert summary["tokens_per_s"] > 0
    assert "nan" not in once.stdout.lower()
    cwd = tmp_path_factory.mktemp("cmp")
    done = run_dtrain(["compare", str(run_dp1.run_dir), str(once.run_dir)], cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 common steps" in done.stdout and "no step diverges" in done.stdout
    mean = sum(losses(run_dp1)) / 10
    assert once.metrics()[0]["loss"] == pytest.approx(mean, rel=1e-6)


@pytest.mark.parametrize("mode", ["off", "bar"])
def test_progress_modes(mode, tmp_path):
    """off: no step lines on the console (the rank's log keeps them); bar: its last state is
    drawn before the summary, not after it."""
    run = run_dtrain(
        [
            "launch",
            "recipe=gpt_tiny",
            "model.n_layer=1",
            "train.steps=3",
            "logging.every=1",
            "optim.warmup_steps=1",
            "train.eval_every=0",
            "logging.tensorboard=false",
            f"logging.progress={mode}",
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "step 3/3" in (run.run_dir / "logs" / "rank_0.log").read_text()
    if mode == "off":
        assert "step 1/3" not in run.stdout and "step 3/3" not in run.stdout, run.stdout
    else:
        assert "step 3/3" in run.stdout
        assert run.stdout.rindex("step 3/3") < run.stdout.index("run summary"), run.stdout
    assert "run summary" in run.stdout


def test_startup_breakdown_adds_up_to_the_first_step(run_dp2):
    """The phases in summary.json run from the command's start to the end of step 1."""
    s = run_dp2.summary()
    phases = s["startup_phases_s"]
    assert list(phases) == [
        "compose",
        "agent",
        "rendezvous+start",
        "process_group",
        "model+data+optim",
        "step_1",
    ]
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(s["startup_first_step_done_s"], abs=0.01)
    line = next(
        x
        for x in run_dp2.stderr.splitlines() + run_dp2.stdout.splitlines()
        if "first step done" in x
    )
    assert "compose" in line and "step_1" in line


SMALL = [
    "recipe=gpt_tiny",
    "model.n_layer=1",
    "dp=2",
    "train.steps=5",
    "optim.warmup_steps=1",
    "logging.tensorboard=false",
]


def test_the_killed_rank_is_blamed_and_a_run_that_trained_keeps_its_logs(tmp_path):
    # a 2 s monitor interval: the agent finds both ranks dead in one poll (rank 0 right after
    # its peer), as it often does at the default; torch then reported rank 0's lost peer
    run = run_dtrain(
        ["launch", *SMALL, "launcher.monitor_interval_s=2"],
        tmp_path,
        env={"DTRAIN_FAULTS": "kill:step=2:rank=1"},
    )
    assert run.returncode == 1
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    assert first.startswith(
        "error: rank 1 was killed by SIGKILL after step 2; rank 0 then lost its peer ("
    ), run.stderr
    assert "Traceback" not in run.stderr  # the cause is a signal: no peer's traceback
    assert (run.run_dir / "logs" / "rank_0.log").is_file()  # it trained: kept for debugging
    assert f"logs: {run.run_dir / 'logs'}" in run.stderr


def test_a_frozen_rank_is_named_not_the_rank_that_timed_out(tmp_path):
    run = run_dtrain(
        ["launch", *SMALL, "debug.collective_timeout_s=5", "debug.hang_watchdog=false"],
        tmp_path,
        env={"DTRAIN_FAULTS": "hang:step=2:rank=1"},
    )
    assert run.returncode == 1
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    assert first.startswith(
        "error: rank 1 stopped answering (frozen?) after step 2; rank 0 then lost its peer ("
    ), run.stderr
    assert "Timed out" in first


def test_a_start_that_fails_before_step_1_leaves_nothing(tmp_path):
    """The launcher says both before any worker starts: a data path that is not there, a
    corpus too small for one window (said by each rank, before)."""
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for split in ("train", "val"):
        (tokens / f"{split}.bin").write_bytes(bytes(10))  # 5 uint16 tokens
    for i, (data, message) in enumerate(
        [
            (["data=text", f"data.path={tmp_path}/nope.txt"], "nope.txt"),
            (["data=tokens", f"data.path={tokens}"], "fewer than one window"),
        ]
    ):
        cwd = tmp_path / f"cwd{i}"
        cwd.mkdir()
        run = run_dtrain(["launch", *SMALL, *data], cwd)
        assert run.returncode != 0 and message in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
        assert list(cwd.iterdir()) == []  # no runs/<run>, no runs/


def test_multi_node_launch_with_a_host_that_does_not_resolve_exits_2_at_once(tmp_path):
    started = time.monotonic()
    run = run_dtrain(
        [
            "launch",
            "recipe=gpt_tiny",
            "dp=4",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--rdzv-endpoint",
            "node0.invalid:29500",
            "--rdzv-id",
            "exp1",
        ],
        tmp_path,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert time.monotonic() - started < 15  # the CLI's start-up; no rendezvous wait
    assert "error: --rdzv-endpoint=node0.invalid:29500: node0.invalid does not resolve" in (
        run.stderr
    )
    assert not (tmp_path / "runs").exists()


def test_reusing_a_run_name_is_blamed_on_the_name(tmp_path):
    old = tmp_path / "runs" / "exp"
    old.mkdir(parents=True)
    (old / "plan.yaml").write_text("kept: true\n")
    run = run_dtrain(["launch", "recipe=gpt_tiny", "run.name=exp"], tmp_path, timeout=60)
    assert run.returncode == 2
    assert run.stderr.startswith(f"error: run.name=exp: {old} already holds a run"), run.stderr
    assert "run.root" not in run.stderr
    assert run.stderr.strip().endswith(f"or continue that one: dtrain resume {old}"), run.stderr
    assert sorted(p.name for p in old.iterdir()) == ["plan.yaml"]  # an existing run untouched
    by_id = run_dtrain(["launch", "recipe=gpt_tiny", "--rdzv-id", "exp"], tmp_path, timeout=60)
    assert by_id.returncode == 2  # one node: --rdzv-id names the run dir, as on many
    assert by_id.stderr.startswith(f"error: --rdzv-id=exp: {old} already holds a run")
    (old / "finished.json").write_text("{}")  # a script's run that finished: no resume
    (tmp_path / "x.py").write_text("")
    again = run_dtrain(["run", "--rdzv-id", "exp", "--", "x.py"], tmp_path, timeout=60)
    assert again.returncode == 2
    assert again.stderr.strip() == (
        f"error: --rdzv-id=exp: {old} already holds a run, which finished; choose another "
        "run.name (or --rdzv-id)"
    ), again.stderr


def test_ctrl_c_stops_every_worker_with_one_clean_message(tmp_path):
    proc = subprocess.Popen(
        [*DTRAIN, "launch", *SMALL, "train.steps=100000", "logging.every=1", "run.name=stop"],
        cwd=tmp_path,
        env={**os.environ, "DTRAIN_CACHE": str(cache_dir())},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the whole process group
    )
    try:
        metrics = tmp_path / "runs" / "stop" / "metrics.jsonl"
        deadline = time.time() + 120
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert "death signal" not in err and "Traceback" not in err, err
    assert "error: stopped by SIGINT; workers terminated" in err.splitlines()


def test_ctrl_c_during_start_up_stops_the_launch_and_leaves_nothing(tmp_path):
    """Ctrl-C while the launcher imports torch and starts the agent (a library's import
    swallowed the KeyboardInterrupt and the run went on to train)."""
    proc = _start_in_background(["launch", *SMALL, "train.steps=100000"], tmp_path)
    try:
        deadline = time.time() + 60
        while not list(tmp_path.glob("runs/*/plan.yaml")):  # composed, run dir written
            assert time.time() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert "error: stopped by SIGINT" in err and "Traceback" not in err, err
    assert "step 1/" not in out
    assert list(tmp_path.iterdir()) == []  # the run dir it created is gone


def test_ctrl_c_while_a_node_waits_for_the_others_keeps_the_shared_run_dir(tmp_path):
    """Node 0 of two, alone at the rendezvous: Ctrl-C exits 130 and keeps the run dir the
    nodes share (another node may have written to it), saying so; the docs said a failed
    start leaves nothing (a new user's find)."""
    from tests.launch.test_cluster_live import free_port

    args = ["launch", *SMALL, "dp=2", "--nnodes", "2", "--node-rank", "0",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "lonely"]  # fmt: skip
    proc = _start_in_background(args, tmp_path)
    try:
        deadline = time.time() + 60
        while not list(tmp_path.glob("runs/lonely/launch.json")):  # its agent is starting
            assert time.time() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(2)  # at the rendezvous, waiting for node 1
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    run_dir = tmp_path / "runs" / "lonely"
    said = " ".join(err.split())
    assert f"kept {run_dir} (its nodes share it): the same command on each node" in said, err
    assert "error: stopped by SIGINT" in err and "Traceback" not in err
    assert (run_dir / "plan.yaml").is_file()


def test_ctrl_c_while_the_fork_server_imports_prints_no_traceback():
    """A terminal's Ctrl-C reaches the workers' fork server too, while it imports dtrain
    and torch (its preload module, before it could install its own handlers): found by the
    test above under load, a KeyboardInterrupt traceback from the server's imports."""
    code = (
        "import sys, dtrain_cli.rundir.env; print('ready', flush=True); "
        "import dtrain_cli.launch.server_preload; print('imported', flush=True); "
        "sys.stdin.read()"  # then it serves, until the launcher ends it
    )
    env = {**os.environ, "DTRAIN_PRELOAD_FIRST": "dtrain_cli.runtime.worker"}  # the preload
    env.pop("DTRAIN_PRELOAD_FILE", None)  # no launcher lists to wait for
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline() == b"ready\n"
    deadline = time.time() + 0.05  # until the server ignores SIGINT (or 50 ms, before the fix)
    while time.time() < deadline and not _ignores_sigint(proc.pid):
        time.sleep(0.001)
    sent, deadline = 0, time.time() + 120
    while proc.poll() is None and not select.select([proc.stdout], [], [], 0.01)[0]:
        proc.send_signal(signal.SIGINT)  # Ctrl-C after Ctrl-C through the whole import
        sent += 1
        assert time.time() < deadline, "the server never said it imported"
    out, err = proc.communicate(timeout=60)  # closes its stdin: it ends
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()[-2000:]
    assert proc.returncode == 0 and out == b"imported\n"
    assert sent > 10


def _ignores_sigint(pid: int) -> bool:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


BAR = re.compile(r"step [1-9]\d*/100000")  # the progress bar's text, drawn at a step


def _plain(output: bytes) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))  # no colours


def test_ctrl_c_on_a_terminal_does_not_glue_the_error_to_the_progress_bar(tmp_path):
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*DTRAIN, "launch", *SMALL, "train.steps=100000", "logging.every=1", "run.name=tty"],
        cwd=tmp_path,
        env={**os.environ, "DTRAIN_CACHE": str(cache_dir()), "COLUMNS": "120"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    try:
        deadline = time.time() + 120
        while not BAR.search(_plain(output)):  # the bar drawn on the terminal
            assert time.time() < deadline and proc.poll() is None, output
            output += _read_pty(master)
        os.killpg(proc.pid, signal.SIGINT)
        while proc.poll() is None and time.time() < deadline:
            output += _read_pty(master)
        output += _read_pty(master)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(master)
    text = _plain(output)
    before, _, _ = text.partition("error: stopped by SIGINT")
    assert _ and before.endswith("\n"), repr(text[-600:])  # the error starts its own line
    assert "death signal" not in text and "Traceback" not in text


def _read_pty(fd: int) -> bytes:
    import select

    ready, _, _ = select.select([fd], [], [], 0.1)
    if not ready:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""


def test_saves_inside_a_logging_window_leave_its_rate_whole(tmp_path):
    """A save restarted the window's clock and the window's steps before it still counted:
    logging every 10 with a save every 3 divided ten steps' tokens by the two after the
    last save (the step line read 5x the rate of the summary on a 5-step run). Every step
    here sleeps 300 ms first (the ``slow`` drill), so a window's ms per step is at least
    300 however loaded the machine; the bug read about a fifth of that."""
    args = ["launch", "recipe=gpt_tiny", "train.steps=20", "logging.every=10"]
    args += ["train.eval_every=0", "logging.tensorboard=false", "logging.progress=lines"]
    run = run_dtrain(
        [*args, "checkpoint.every_steps=3"], tmp_path, env={"DTRAIN_FAULTS": "slow:ms=300"}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    ms = {r["step"]: r["step_time_ms"] for r in run.metrics()}
    # the second window (steps 11-20, saves after 12, 15 and 18): no warm-up step in it
    assert ms[20] >= 300, ms


@pytest.mark.parametrize("pool", ["0", "1"], ids=["own_server", "warm_pool"])
def test_workers_end_with_a_launcher_killed_by_sigkill(tmp_path, pool):
    """kill -9 of the launcher (the OOM killer): its workers, forked by a fork server they
    keep alive, trained on alone (with no warm pool), into a run dir a resume then shared
    (a reviewer's find). Each worker ends with its launcher."""
    args = ["launch", *SMALL, "dp=2", "train.steps=100000", "run.name=orphans"]
    proc = subprocess.Popen(
        [*DTRAIN, *args],
        cwd=tmp_path,
        env={**os.environ, "DTRAIN_CACHE": str(cache_dir()), "DTRAIN_WARM_POOL": pool},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    logs = [tmp_path / "runs" / "orphans" / "logs" / f"rank_{r}.log" for r in (0, 1)]
    try:
        deadline = time.time() + 120
        while not all(p.exists() and "step" in p.read_text() for p in logs):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.2)
        workers = [int(p.read_text().split(" pid ", 1)[1].split()[0]) for p in logs]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 10
        while any(_running(w) for w in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if _running(w)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reaped-later child of a process that is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _start_in_background(args: list[str], cwd: Path) -> subprocess.Popen:
    """``dtrain ARGS`` in a session of its own (a signal reaches its whole group), its
    output piped, the test cache shared."""
    return subprocess.Popen(
        [*DTRAIN, *args],
        cwd=cwd,
        env={**os.environ, "DTRAIN_CACHE": str(cache_dir())},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
