"""The warm worker pool (dtrain_cli/launch/warm_pool.py, pool_server.py): launches in fresh
interpreters, with the pool on, in a pool folder of the test's own.

The rest of the tests run with ``DTRAIN_WARM_POOL=0`` (tests/conftest.py); here a launch
served by the pool must train exactly as one that started its own fork server, take the
launch's own environment, and the pool must end when asked, when idle, and when stale.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import rank_process
from tests.conftest import DTRAIN, cache_dir

TINY = [
    "recipe=gpt_tiny",
    "dp=2",
    "train.steps=3",
    "logging.every=1",
    "train.eval_every=0",
    "train.eval_batches=1",
    "logging.tensorboard=false",
    "logging.progress=lines",
    "checkpoint.every_steps=0",
]
STARTED = "started a warm worker pool"


@pytest.fixture
def pool_dir():
    where = Path(tempfile.mkdtemp(prefix="dtp-"))  # short: a socket path has 108 bytes
    yield where
    env = {**os.environ, "DTRAIN_WARM_POOL_DIR": str(where)}
    subprocess.run([*DTRAIN, "pool", "stop"], env=env, capture_output=True, timeout=60)
    shutil.rmtree(where, ignore_errors=True)


def launch(tmp_path: Path, name: str, pool_dir: Path, *, pool: bool = True, **env: str):
    """One launch; (its process, stdout+stderr, summary)."""
    full = {
        **os.environ,
        "DTRAIN_CACHE": str(cache_dir()),
        "DTRAIN_WARM_POOL": "1" if pool else "0",
        "DTRAIN_WARM_POOL_DIR": str(pool_dir),
        "DTRAIN_WARM_POOL_IDLE_S": "120",
        **env,
    }
    cmd = [*DTRAIN, "launch", *TINY, f"run.root={tmp_path}/runs", f"run.name={name}"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out, _ = proc.communicate(timeout=300)
    summary_file = tmp_path / "runs" / name / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    return proc, out, summary


def pool_log(pool_dir: Path) -> str:
    return "".join(p.read_text() for p in pool_dir.glob("*.log"))


def pool_pid(pool_dir: Path) -> int | None:
    env = {**os.environ, "DTRAIN_WARM_POOL_DIR": str(pool_dir)}
    out = subprocess.run([*DTRAIN, "pool"], env=env, capture_output=True, text=True, timeout=60)
    words = out.stdout.split()
    return int(words[3].rstrip(":")) if out.stdout.startswith("warm pool pid") else None


def gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_launches_served_by_the_pool_train_as_without_it(tmp_path, pool_dir):
    _, out, own = launch(tmp_path, "own", pool_dir, pool=False)
    assert own is not None, out[-2000:]
    assert STARTED not in out and not list(pool_dir.glob("*.sock"))  # DTRAIN_WARM_POOL=0

    first, out1, started = launch(tmp_path, "first", pool_dir)
    assert first.returncode == 0, out1[-2000:]
    assert STARTED in out1
    second, out2, served = launch(tmp_path, "second", pool_dir)
    assert second.returncode == 0, out2[-2000:]
    assert STARTED not in out2  # the same pool, still warm

    for summary in (started, served):
        assert summary["final_loss"] == own["final_loss"]
        assert summary["param_sum"] == own["param_sum"]
    log = pool_log(pool_dir)
    assert f"served launcher {first.pid}:" in log and f"served launcher {second.pid}:" in log

    pid = pool_pid(pool_dir)
    assert pid is not None
    env = {**os.environ, "DTRAIN_WARM_POOL_DIR": str(pool_dir)}
    stop = subprocess.run(
        [*DTRAIN, "pool", "stop"], env=env, capture_output=True, text=True, timeout=60
    )
    assert stop.stdout.strip() == "warm pool stopped"
    assert gone(pid)
    assert not list(pool_dir.glob("*.sock"))
    assert pool_pid(pool_dir) is None


def test_a_served_launch_has_its_own_environment(tmp_path, pool_dir):
    """The pool was started by a launch without a fault drill; the next launch's drill
    (DTRAIN_FAULTS, read by the workers) acts: the server and its workers take the
    launch's environment, not the pool's."""
    _, out, _ = launch(tmp_path, "plain", pool_dir)
    assert STARTED in out
    proc, out, _ = launch(tmp_path, "drill", pool_dir, DTRAIN_FAULTS="kill:step=2:rank=1")
    assert f"served launcher {proc.pid}:" in pool_log(pool_dir)  # not a server of its own
    assert proc.returncode != 0
    assert "rank 1" in out and "SIGKILL" in out, out[-2000:]


def _long_launch(tmp_path: Path, pool_dir: Path, name: str):
    """A launch of 100,000 steps, read up to its 3rd step: (process, run dir, its output so
    far, its workers' (pid, host))."""
    full = {
        **os.environ,
        "DTRAIN_CACHE": str(cache_dir()),
        "DTRAIN_WARM_POOL": "1",
        "DTRAIN_WARM_POOL_DIR": str(pool_dir),
    }
    long = [arg for arg in TINY if not arg.startswith("train.steps=")] + ["train.steps=100000"]
    cmd = [*DTRAIN, "launch", *long, f"run.root={tmp_path}/runs", f"run.name={name}"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("step 3/"):
            break
    run_dir = tmp_path / "runs" / name
    workers = [rank_process(RunDir(run_dir), rank) for rank in (0, 1)]
    return proc, run_dir, "".join(seen), workers


def test_a_stale_pool_is_replaced_and_an_idle_one_ends(tmp_path, pool_dir):
    """A variable torch reads at import differs: the pool is stale and the launch starts
    another. The stale pool still serves a run: it stops listening but stays until that run
    ends, so a SIGKILL of that run's launcher still ends its workers (and then the stale
    pool). With nothing to serve, the new pool ends after its idle time."""
    proc, _run_dir, seen, workers = _long_launch(tmp_path, pool_dir, "a")
    try:
        assert STARTED in seen and all(workers), (seen[-2000:], workers)
        old = pool_pid(pool_dir)
        other, out, summary = launch(
            tmp_path, "b", pool_dir, TORCH_DTRAIN_TEST="1", DTRAIN_WARM_POOL_IDLE_S="3"
        )
        assert other.returncode == 0 and summary is not None, out[-2000:]
        assert STARTED in out
        new = int(out.split(STARTED + " (pid ")[1].split(")")[0])
        assert old is not None and new != old
        assert not gone(old, within_s=1)  # still watching run a
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert all(gone(pid, within_s=10) for pid, _host in workers)
    assert gone(old)  # its last server ended: so did the stale pool
    assert gone(new, within_s=30)  # idle for 3 s after the launch's server ended
    assert not list(pool_dir.glob("*.sock"))


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_script(cwd: Path, pool_dir: Path, args: list[str], *, pool: bool = True):
    """One ``dtrain run dp=2``; (its process, stdout, stderr)."""
    full = {
        **os.environ,
        "DTRAIN_CACHE": str(cache_dir()),
        "DTRAIN_WARM_POOL": "1" if pool else "0",
        "DTRAIN_WARM_POOL_DIR": str(pool_dir),
        "DTRAIN_WARM_POOL_IDLE_S": "120",
    }
    cmd = [*DTRAIN, "run", "dp=2", f"run.root={cwd}/runs", "--", *args]
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=300)
    return proc, out, err


def test_a_script_served_by_the_pool_runs_as_without_it_and_leaves_nothing(tmp_path, pool_dir):
    """``dtrain run`` of a torchrun-style script: the same final parameters with and without
    the pool; a child a rank leaves running ends with the run (the pool's server is a
    subreaper, and the launcher ends what is in its tree), and the pool stays."""
    ddp = str(SCRIPTS / "ddp_plain.py")
    own, _, err = run_script(
        tmp_path, pool_dir, [ddp, "--steps", "4", "--out", "own.json"], pool=False
    )
    assert own.returncode == 0, err[-2000:]
    served, _, err = run_script(tmp_path, pool_dir, [ddp, "--steps", "4", "--out", "pool.json"])
    assert served.returncode == 0, err[-2000:]
    assert STARTED in err
    mine = json.loads((tmp_path / "own.json").read_text())
    theirs = json.loads((tmp_path / "pool.json").read_text())
    assert theirs["params"] == mine["params"] and theirs["world"] == 2

    left, out, err = run_script(tmp_path, pool_dir, [str(SCRIPTS / "ends.py"), "leave_a_child"])
    assert left.returncode == 0, err[-2000:]
    log = pool_log(pool_dir)
    assert f"served launcher {served.pid}:" in log and f"served launcher {left.pid}:" in log
    children = [int(line.split()[1]) for line in out.splitlines() if line.startswith("child ")]
    assert len(children) == 2
    assert all(gone(pid, within_s=5) for pid in children)
    assert pool_pid(pool_dir) is not None


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _wait_states(pids: list[int], stopped: bool, within_s: float = 20.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        states = [_state(pid) for pid in pids]
        if all((s == "T") == stopped for s in states):
            break
        time.sleep(0.1)
    return states


def test_a_killed_launcher_takes_its_workers_with_it(tmp_path, pool_dir):
    """The launcher is SIGKILLed mid-run (a `timeout -s KILL`, an IDE's stop): its workers
    are the pool's server's, not its children, yet they end too (the pool ends the server's
    process group once the launcher is gone), and the pool serves the next launch.
    Before that, a terminal's Ctrl-Z (SIGTSTP to the launcher, whose process group the
    terminal stops; the workers are in the pool's) stops the workers too, and SIGCONT
    (``fg``) continues them: nothing trains while stopped, steps follow after."""
    launch(tmp_path, "warm", pool_dir)
    proc, run_dir, _seen, workers = _long_launch(tmp_path, pool_dir, "killed")
    try:
        assert all(workers), workers
        pids = [proc.pid, *(pid for pid, _host in workers)]
        os.kill(proc.pid, signal.SIGTSTP)
        assert _wait_states(pids, stopped=True) == ["T", "T", "T"]
        logged = RunDir(run_dir).metrics.read_text()
        time.sleep(2)
        assert RunDir(run_dir).metrics.read_text() == logged  # no step while stopped
        os.kill(proc.pid, signal.SIGCONT)
        assert "T" not in _wait_states(pids, stopped=False)
        for line in proc.stdout:  # training goes on
            if line.startswith("step ") and int(line.split()[1].split("/")[0]) > 5:
                break
        assert RunDir(run_dir).metrics.read_text() != logged
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"served launcher {proc.pid}:" in pool_log(pool_dir)
    assert all(gone(pid, within_s=10) for pid, _host in workers)
    again, out, summary = launch(tmp_path, "after", pool_dir)
    assert again.returncode == 0 and summary is not None, out[-2000:]
    assert f"served launcher {again.pid}:" in pool_log(pool_dir)
