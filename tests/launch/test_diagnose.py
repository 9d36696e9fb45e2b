"""When a run goes wrong, dtrain says where (issue 14): fault drills on 2 CPU ranks (gloo).

Seven launches in all, shared by the assertions: a plain run with a slowed rank and a
profile, NaN skip / rollback / stop, a hang, a mismatched collective, a perturbed replica.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.conftest import Run, run_dtrain, wait_for_checkpoint

pytestmark = pytest.mark.multiproc

DIAG = [
    "recipe=gpt_tiny",
    "dp=2",
    "train.steps=8",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "logging.every=1",
    "logging.progress=off",
    "logging.tensorboard=false",
    "debug.replica_check_at_end=true",
]


def drill(cwd: Path, faults: str, *extra: str, timeout: float = 240) -> tuple[Run, float]:
    run = run_dtrain(["launch", *DIAG, *extra], cwd, timeout=timeout, env={"DTRAIN_FAULTS": faults})
    return run, time.time()


def ok(run: Run) -> Run:
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def no_process_left(path: Path) -> list[str]:
    """Processes whose command line mentions ``path`` (forked workers carry the launch
    cwd in their fork server's sys.path)."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmd:
            left.append(f"{proc.name}: {cmd[:200]}")
    return left


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Run:
    """Rank 1 sleeps 800 ms in every step; steps 3-4 profiled."""
    run, _ = drill(
        tmp_path_factory.mktemp("plain"), "slow:rank=1:ms=800", "debug.profile_steps=[3,4]"
    )
    return ok(run)


@pytest.fixture(scope="module")
def skipped(tmp_path_factory) -> Run:
    """NaN on rank 1 at step 5, a loss spike on rank 1 at step 7: both updates skipped."""
    run, _ = drill(
        tmp_path_factory.mktemp("skip"),
        "nan:step=5:rank=1,spike:step=7:rank=1",
        "train.on_nan=skip",
        "train.on_spike=skip",
    )
    return ok(run)


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory) -> Run:
    run, _ = drill(
        tmp_path_factory.mktemp("rollback"),
        "nan:step=5:rank=1,spike:step=7:rank=1",
        "train.on_nan=rollback",
        "train.on_spike=rollback",
        "checkpoint.every_steps=2",
    )
    return ok(run)


@pytest.fixture(scope="module")
def without_bad_data(tmp_path_factory) -> Run:
    """The reference of skip and rollback: no fault, the data windows of steps 5 and 7 cut
    from the stream (step 5 trains on step 6's window, step 6 on step 8's), 6 steps: the
    6 updates the policies keep, with the same LR positions (warmup: 10 steps)."""
    run, _ = drill(tmp_path_factory.mktemp("reference"), "drop:step=5,drop:step=6", "train.steps=6")
    return ok(run)


def test_straggler_is_named_in_the_log_metrics_and_summary(plain):
    train = plain.metrics()
    named = [r["stragglers"] for r in train[1:]]  # after the warm-up step
    assert sum(1 for s in named if s == [1]) >= len(named) // 2, named
    assert all(0 not in s for s in named), named
    assert "straggler at step" in (plain.run_dir / "logs" / "rank_0.log").read_text()
    medians = plain.summary()["rank_compute_ms_median"]
    assert medians[1] > medians[0] + 400, medians  # the 800 ms sleep is rank 1's own time
    assert plain.summary()["stragglers"].get("1", 0) >= len(named) // 2


def test_profile_writes_a_loadable_trace_per_rank(plain):
    for rank in (0, 1):
        path = plain.run_dir / "profile" / f"rank_{rank}.trace.json"
        events = json.loads(path.read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        assert any("aten::" in n for n in names)
        # the profiled steps 3 and 4 are spans of their own (a user saw no step boundary)
        assert {"ProfilerStep#3", "ProfilerStep#4"} <= names, sorted(names)[:20]
        assert any("gloo" in n or "all_reduce" in n or "allreduce" in n for n in names), rank
    assert "profile of steps 3-4" in (plain.run_dir / "logs" / "rank_0.log").read_text()
    # kineto's "USDT: ... SyncActivityProfilerHandler.cpp:52] profiler_start" on the console
    assert "profiler_start" not in plain.stdout + plain.stderr
    files = next(x for x in plain.stdout.splitlines() if x.strip().startswith("files:"))
    assert "profile/" in files.split()  # the end of the run lists the traces' folder


@pytest.mark.parametrize("policy", ["skip", "rollback"])
def test_skip_and_rollback_each_equal_a_run_without_the_bad_data(
    policy, plain, skipped, rolled_back, without_bad_data
):
    """Issue 24 #20: each policy against an independent reference (a plain run whose bad
    data windows were cut), not against the other policy: the same parameters, bit for
    bit, and the same losses step for step (reference step 5 = step 6, 6 = 8)."""
    run = skipped if policy == "skip" else rolled_back
    s, ref = run.summary(), without_bad_data.summary()
    counted = "skipped" if policy == "skip" else "rollbacks"
    assert s["numerics"][f"nan_{counted}"] == 1 and s["numerics"][f"spike_{counted}"] == 1
    assert s["steps"] == 8 and ref["steps"] == 6
    # rank 1 alone saw the NaN: the decision was taken on both ranks
    assert s["replicas_identical"] is True and ref["replicas_identical"] is True
    assert s["param_digest"] == ref["param_digest"]
    assert s["param_digest"] != plain.summary()["param_digest"]
    got = {r["step"]: r["loss"] for r in run.metrics()}
    want = {r["step"]: r["loss"] for r in without_bad_data.metrics()}
    assert [got[k] for k in (1, 2, 3, 4, 6, 8)] == [want[k] for k in range(1, 7)]
    if policy == "skip":  # the lr each kept step used: it was the schedule's at the step
        # number, one position ahead after each skip (the schedule does not advance there)
        lr = {r["step"]: r["lr"] for r in run.metrics()}
        want_lr = {r["step"]: r["lr"] for r in without_bad_data.metrics()}
        assert [lr[k] for k in (1, 2, 3, 4, 6, 8)] == [want_lr[k] for k in range(1, 7)]
    if policy == "rollback":
        log = (run.run_dir / "logs" / "rank_1.log").read_text()
        assert "restored checkpoint step 4" in log and "restored checkpoint step 6" in log


def test_nan_stop_names_the_step_the_rank_and_the_parameter(tmp_path):
    run, _ = drill(tmp_path, "nan:step=3:rank=1", "train.steps=4", "logging.every=2")
    assert run.returncode == 1
    line = next(x for x in run.stderr.splitlines() if "NumericsError" in x)
    assert "at step 3 on rank 1" in line and "train.on_nan=stop" in line
    assert "first non-finite: parameter " in line and "module." not in line
    assert "Traceback" not in run.stderr


def test_hang_ends_soon_and_names_the_rank_that_never_joined(tmp_path):
    run, ended = drill(tmp_path, "hang:step=3:rank=1", "debug.collective_timeout_s=10")
    assert run.returncode == 124, run.stderr[-2000:]
    hang = run.run_dir / "logs" / "hang"
    records = {r: json.loads((hang / f"rank_{r}.json").read_text()) for r in (0, 1)}
    started = min(rec["time"] - rec["waited_s"] for rec in records.values())
    assert ended - started < 10 + 30, ended - started
    msg = next(x for x in run.stderr.splitlines() if "hang:" in x)
    assert "rank 1 never joined all_reduce #3 (step 3, logging)" in msg
    assert "rank 0 waited in it" in msg and "logs/hang" in msg
    # every rank's Python stack, the main thread's frames included: rank 0 in the
    # logging all-reduce, rank 1 frozen by the drill at the end of step 3
    assert "in log_step" in (hang / "rank_0.txt").read_text()
    assert "in maybe_fail" in (hang / "rank_1.txt").read_text()
    assert "(rank 1 at faults.py:" in msg and "in maybe_fail)" in msg
    assert records[0]["collective"]["inside"] is True
    assert records[1]["collective"]["count"] == 2
    for rec in records.values():
        with pytest.raises(ProcessLookupError):
            os.kill(rec["pid"], 0)
    assert no_process_left(tmp_path) == []


def test_a_rank_killed_by_its_own_fault_leaves_its_python_stack(tmp_path):
    """A segmentation fault in a C extension (or an abort) ended a rank with only 'rank 1
    was killed by SIGSEGV': where it was is now in its log (faulthandler), and said."""
    run, _ = drill(tmp_path, "segv:step=3:rank=1")
    assert run.returncode != 0, run.stderr[-2000:]
    line = next(x for x in run.stderr.splitlines() if x.startswith("error:"))
    # the step comes from rank 0's note that it lost its peer, when it wrote one before the
    # agent stopped it (a real fault leaves no note of its own: neither does the drill)
    stack = "; its Python stack is in logs/rank_1.log"
    assert re.match(rf"error: rank 1 was killed by SIGSEGV( after step 3)?{stack}", line), line
    log = (run.run_dir / "logs" / "rank_1.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
    assert "in maybe_fail" in log and "trainer.py" in log, log[-2000:]
    assert no_process_left(tmp_path) == []


def test_a_stopped_rank_ends_the_run_within_the_stated_bound(tmp_path):
    """Issue 24 #15: a rank frozen from outside (SIGSTOP) writes no record and ignores the
    agent's SIGTERM; the launcher kills it 10 s after the first record, so the run ends
    within collective_timeout_s + 15 s of the step (+ a few s of start-up on a loaded
    machine), not after the agent's 30 s grace."""
    run, ended = drill(tmp_path, "stop:step=3:rank=1", "debug.collective_timeout_s=5")
    assert run.returncode == 124, run.stderr[-2000:]
    record = json.loads((run.run_dir / "logs" / "hang" / "rank_0.json").read_text())
    started = record["time"] - record["waited_s"]
    assert ended - started < 5 + 15 + 5, ended - started
    msg = next(x for x in run.stderr.splitlines() if "hang:" in x)
    assert "rank 1 wrote no record" in msg and "rank 0 waited in it" in msg
    assert no_process_left(tmp_path) == []


def test_a_save_slower_than_the_watchdog_is_no_hang(tmp_path):
    """Issue 24 #15: every rank's save takes 8 s, the watchdog's limit is 5 s: the save is
    not counted, the run completes."""
    run, _ = drill(
        tmp_path,
        "slow_save:ms=8000",
        "debug.collective_timeout_s=5",
        "train.steps=2",
        "checkpoint.every_steps=2",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert not (run.run_dir / "logs" / "hang").exists()
    assert (run.run_dir / "checkpoints" / "step_000002").is_dir()


def test_check_collectives_names_the_first_mismatch(tmp_path):
    run, _ = drill(tmp_path, "mismatch:step=2:rank=1", "debug.check_collectives=true")
    assert run.returncode == 1
    line = next(x for x in run.stderr.splitlines() if "CollectiveMismatch" in x)
    # the logging all-reduce: 3 votes + 3 slots per rank, one more on rank 1
    assert "rank 0 ALLREDUCE shape [9] Float" in line and "rank 1 ALLREDUCE shape [10]" in line
    assert "all_reduce #2, step 2, logging" in line


def test_replica_check_names_the_rank_and_parameter(tmp_path):
    run, _ = drill(
        tmp_path,
        "perturb:step=3:rank=1",
        "debug.replica_check_every=2",
        "debug.replica_check_grads=true",
    )
    assert run.returncode == 1
    line = next(x for x in run.stderr.splitlines() if "ReplicaError" in x)
    assert "step 4: data-parallel replicas differ: rank 1 (dp rank 1)" in line
    assert "pos_embeddings.weight" in line and "1 of " in line


def test_replica_check_compares_hsdp_shard_groups(tmp_path):
    """hsdp holds no whole replica, but rank 3 holds the shard rank 1 holds (the other
    shard group): a perturbed shard is named (it was never compared)."""
    run, _ = drill(
        tmp_path,
        "perturb:step=2:rank=3",
        "dp=4",
        "parallel.strategy=hsdp",
        "parallel.dp_shard=2",
        "train.global_batch_size=8",
        "debug.replica_check_every=2",
    )
    assert run.returncode == 1
    line = next(x for x in run.stderr.splitlines() if "ReplicaError" in x)
    assert "step 2: hsdp replicas (shard groups) differ: rank 3 (dp_replicate rank 1)" in line
    assert "than rank 1 (dp_replicate rank 0)" in line and "pos_embeddings.weight" in line


def image_has_a_plot(path: Path) -> None:
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.size[0] > 300 and image.size[1] > 200
        stat = ImageStat.Stat(image.convert("L"))
        assert stat.var[0] > 100, path  # not a blank canvas


def test_report_writes_png_plots_and_a_summary(plain, tmp_path):
    out = tmp_path / "plots"
    done = run_dtrain(["report", str(plain.run_dir), "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    names = {"loss.png", "lr.png", "tokens_per_s.png", "step_breakdown.png", "ranks.png"}
    assert names <= {p.name for p in out.iterdir()}
    for name in names:
        image_has_a_plot(out / name)
    text = (out / "summary.txt").read_text()
    assert "stragglers" in text and f"{plain.metrics()[-1]['loss']:.4f}" in text


def test_compare_finds_the_first_divergent_step(plain, skipped, tmp_path):
    done = run_dtrain(["compare", str(plain.run_dir), str(skipped.run_dir)], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "first divergent step 5" in done.stdout
    image_has_a_plot(tmp_path / "compare.png")  # the current directory, not a run's
    same = run_dtrain(["compare", str(plain.run_dir), str(plain.run_dir)], tmp_path)
    assert same.returncode == 0 and "no step diverges" in same.stdout


def test_a_diverged_runs_metrics_stay_json_that_any_parser_reads(tmp_path):
    """A loss gone to NaN was written as a bare NaN in metrics.jsonl, which jq, JavaScript
    and json.loads(parse_constant=...) refuse (summary.json said null already); it is null
    now, and dtrain report reads it back as not a number."""

    def strict(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    args = ["optim.base_lr=1e6", "optim.warmup_steps=0", "train.steps=6", "logging.every=2"]
    run = run_dtrain(["launch", *DIAG, *args], tmp_path)
    assert run.returncode == 1 and "NumericsError" in run.stderr  # train.on_nan=stop
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=strict) for line in lines]
    train = [r for r in records if r["kind"] == "train"]
    assert any(r["loss"] is None for r in train), train
    report = run_dtrain(["report", str(run.run_dir)], tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr


@pytest.mark.multiproc
def test_a_restart_after_a_real_kill_names_the_killed_rank(tmp_path):
    """kill -9 of rank 1 (no drill: the rank writes no note): the restarted group said
    'after rank(s) 0 lost a peer (another rank was killed?)'. The launcher now notes the
    signal for the rank it found killed."""
    import signal
    import subprocess

    from tests.conftest import DTRAIN, cache_dir

    args = [*DIAG, "train.steps=100", "checkpoint.every_steps=2", "launcher.max_restarts=1",
            "run.name=killed"]  # fmt: skip
    proc = subprocess.Popen(
        [*DTRAIN, "launch", *args],
        cwd=tmp_path,
        env={**os.environ, "DTRAIN_CACHE": str(cache_dir())},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = tmp_path / "runs" / "killed"
    log = run_dir / "logs" / "rank_1.log"
    try:
        wait_for_checkpoint(run_dir, 4, proc)
        pid = int(log.read_text().split("rank 1 pid ", 1)[1].split()[0])
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = " ".join(out.split())
    assert "restarted (attempt 1 of 1) after rank 1 was killed by SIGKILL" in said, out[-3000:]
    assert proc.returncode == 0, out[-3000:]


@pytest.mark.parametrize(
    ("policy", "extra"), [("skip", []), ("rollback", ["checkpoint.every_steps=2"])]
)
def test_a_spike_dropped_from_a_one_step_window_is_not_a_nan(tmp_path, policy, extra):
    """logging.every=1 under the default on_nan=stop: the window of the dropped step counts
    no step, its mean is 0/0, and that NaN stopped the run ('non-finite global gradient
    norm by step 7; train.on_nan=stop'), though nothing was non-finite."""
    run, _ = drill(tmp_path, "spike:step=7:rank=1", f"train.on_spike={policy}", *extra)
    ok(run)
    counted = "skipped" if policy == "skip" else "rollbacks"
    assert run.summary()["numerics"][f"spike_{counted}"] == 1
    window = next(r for r in run.metrics() if r["step"] == 7)
    assert window["loss_steps"] == 0 and window["loss"] is None


@pytest.mark.parametrize("layout", [["tp=2"], ["tp=2", "dp=2", "parallel.strategy=fsdp"]])
def test_tensor_parallel_ranks_keep_what_tp_does_not_split_alike_under_dropout(layout, tmp_path):
    """Each rank seeded its dropout with its own rank: the tp ranks of one replica dropped
    different units of the residual stream they hold alike, and the norms tp does not split
    drifted apart (a review's find). The replica check compares them over the tp group (under
    FSDP too: there they are DTensors of the dp mesh alone); the tp ranks now draw alike."""
    args = ["launch", "recipe=gpt_tiny", *layout, "model.dropout=0.1", "train.steps=4",
            "debug.replica_check_every=1", "logging.tensorboard=false"]  # fmt: skip
    run = run_dtrain(args, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ReplicaError" not in run.stderr
