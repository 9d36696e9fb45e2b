"""``dtrain run train.py``: your own script under dtrain's launcher, against real torchrun.

The DDP script (tests/scripts/ddp_plain.py) is written the torchrun way and imports no
dtrain; tests/scripts/probepkg/probe.py reports what a script sees and misbehaves on
purpose. Launches are shared through module-scoped fixtures.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DTRAIN, REPO, Run, run_dtrain, run_reference, session_processes

SCRIPTS = REPO / "tests" / "scripts"
DDP = SCRIPTS / "ddp_plain.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
# differ by nature between two launches: a free port, a fresh id, a temp file
PER_LAUNCH = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
# torchrun's flag that its agent hosts the store, kept by dtrain to the rank's own
# init_process_group: processes a script starts inherit it under torchrun and wait for a
# store at their own address that nobody hosts (dtrain_cli/runtime/script/arrival.py)
KEPT_TO_THE_RANK = {"TORCHELASTIC_USE_AGENT_STORE"}
TORCHRUN_KEYS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "OMP_NUM_THREADS",
}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}


def torchrun(nproc: int, out: Path, dump: Path, cwd: Path) -> subprocess.CompletedProcess:
    args = ["--standalone", f"--nproc-per-node={nproc}", str(DDP), "--steps", "6"]
    return run_reference(
        [str(TORCHRUN), *args, "--out", str(out), "--dump", str(dump)],
        cwd=cwd,
        timeout=300,
        env=env(),
    )


@pytest.fixture(scope="module", params=[2, 4], ids=["2proc", "4proc"])
def ddp_pair(request, tmp_path_factory):
    """The same script and arguments under torchrun and under dtrain run."""
    n = request.param
    cwd = tmp_path_factory.mktemp(f"ddp{n}")
    ref = torchrun(n, cwd / "torchrun.json", cwd / "dump_torchrun", cwd)
    assert ref.returncode == 0, ref.stderr[-3000:]
    # script path relative to cwd, script args that look like overrides: --lr=0.1
    rel = os.path.relpath(DDP, cwd)
    run = run_dtrain(
        [
            "run",
            f"dp={n}",
            "--",
            rel,
            "--steps",
            "6",
            "--lr=0.1",
            "--out",
            "dtrain.json",
            "--dump",
            "dump_dtrain",
        ],
        cwd,
        env=env(),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return n, cwd, run, rel


@pytest.mark.multiproc
def test_ddp_script_same_final_parameters_as_torchrun(ddp_pair):
    n, cwd, run, _ = ddp_pair
    ref = json.loads((cwd / "torchrun.json").read_text())
    got = json.loads((cwd / "dtrain.json").read_text())
    assert ref["world"] == got["world"] == n
    assert got["params"] == ref["params"]  # same arithmetic, same order: bit for bit
    assert (run.run_dir / "plan.yaml").is_file() and (run.run_dir / "config.yaml").is_file()
    for rank in range(n):  # every rank's output in its own log
        assert "first step done" in (run.run_dir / "logs" / f"rank_{rank}.log").read_text()


@pytest.mark.multiproc
def test_worker_env_has_every_torchrun_variable_with_the_same_values(ddp_pair):
    n, cwd, run, rel = ddp_pair
    for rank in range(n):
        ref = json.loads((cwd / "dump_torchrun" / f"rank_{rank}.json").read_text())
        got = json.loads((cwd / "dump_dtrain" / f"rank_{rank}.json").read_text())
        given = env()  # what both launchers were started with
        added = {k for k in ref["env"] if given.get(k) != ref["env"][k]}  # torchrun's own
        assert added >= TORCHRUN_KEYS
        missing = sorted(added - set(got["env"]) - KEPT_TO_THE_RANK)
        assert missing == [], f"rank {rank}: torchrun sets {missing}, dtrain run does not"
        # kept from what the script starts (tests/launch/test_script_own_rendezvous.py)
        assert ref["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert "TORCHELASTIC_USE_AGENT_STORE" not in got["env"]
        differ = {
            k for k in added - PER_LAUNCH - KEPT_TO_THE_RANK if got["env"][k] != ref["env"][k]
        }
        assert differ == set(), {k: (ref["env"][k], got["env"][k]) for k in differ}
        assert got["env"]["RANK"] == str(rank) and got["env"]["WORLD_SIZE"] == str(n)
        assert got["env"]["DTRAIN_RUN_DIR"] == str(run.run_dir)
        assert got["env"]["DTRAIN_PLAN"] == str(run.run_dir / "plan.yaml")
        # what python script.py gives a script, as under torchrun
        tail = ["--out", "dtrain.json", "--dump", "dump_dtrain"]
        assert got["argv"] == [rel, "--steps", "6", "--lr=0.1", *tail]
        assert ref["argv"][1:4] == ["--steps", "6", "--out"]
        assert got["name"] == ref["name"] == "__main__"
        assert got["file"] == ref["file"] == str(DDP)
        assert got["path0"] == ref["path0"] == str(SCRIPTS)
        assert got["imported"] == ref["imported"] and got["main_is_module"]
        # the fork server froze its imports (torch's, dtrain's): the script's collector
        # walks fewer objects than in torchrun's fresh interpreter, which walks torch's
        assert got["gc_scanned"] < ref["gc_scanned"] / 2, (got["gc_scanned"], ref["gc_scanned"])


@pytest.fixture(scope="module")
def module_run(tmp_path_factory):
    """-m form, a fresh interpreter per rank (spawn), script_env read back."""
    out = tmp_path_factory.mktemp("module") / "out"
    cwd = out.parent
    args = ["run", "dp=2", "launcher.start_method=spawn", "train.global_batch_size=12"]
    args += ["optim.warmup_steps=3", "train.steps=7", "checkpoint.every_steps=3"]
    args += ["-m", "probepkg.probe", "dump", str(out), "--lr=3", "dp=9"]
    run = run_dtrain(args, cwd, env={"PYTHONPATH": f"{REPO}:{SCRIPTS}"})
    return run, out


@pytest.mark.multiproc
def test_module_form_under_spawn_sees_python_m_and_the_plan(module_run):
    from dtrain_cli.plan.plan import Plan

    run, out = module_run
    assert run.returncode == 0, run.stdout + run.stderr
    plan = Plan.load(run.run_dir / "plan.yaml")
    for rank in range(2):
        seen = json.loads((out / f"rank_{rank}.json").read_text())
        probe = str(SCRIPTS / "probepkg" / "probe.py")
        # python -m: argv[0] the module's file, the rest untouched (overrides-looking too)
        assert seen["argv"] == [probe, "dump", str(out), "--lr=3", "dp=9"]
        assert (seen["name"], seen["package"], seen["file"]) == ("__main__", "probepkg", probe)
        assert seen["helper"] == "relative import"
        assert seen["path0"] == str(out.parent)  # -m: the current directory
        assert seen["torch_preloaded"] is False  # spawn: a fresh interpreter
        assert (seen["global_batch"], seen["micro"], seen["accum"]) == (12, 6, 1)
        assert seen["lrs"] == [plan.lr.lr_at(s) for s in range(7)]
        assert seen["lrs"][0] == pytest.approx(plan.lr.peak_lr / 3)  # warmup
        assert seen["coords"] == {"pp": 0, "dp": rank, "tp": 0}
        assert seen["ckpt_steps"] == [3, 6, 7]
        assert seen["run_dir"] == str(run.run_dir)


def run_probe(tmp_path: Path, *args: str, timeout: int = 180) -> Run:
    """``dtrain run dp=2 [overrides] -m probepkg.probe MODE OUT``, workers from the warm
    launcher (tests/scripts on the path)."""
    env = {"PYTHONPATH": f"{REPO}:{SCRIPTS}"}
    return run_dtrain(["run", "dp=2", *args], tmp_path, timeout=timeout, env=env, warm=True)


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("mode", "code", "shown"),
    [
        ("raise", 1, ["Traceback", 'probe.py", line', "ValueError: boom from rank 1"]),
        ("exit3", 3, ['exited with code 3 (its last line: "bad data on rank 1")']),
    ],
)
def test_failing_rank_exit_code_and_its_last_lines(tmp_path, mode, code, shown):
    run = run_probe(tmp_path, "-m", "probepkg.probe", mode, str(tmp_path / "out"))
    assert run.returncode == code, run.stdout + run.stderr
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    said = f"failed (exit code {code}): {shown[-1]}" if mode == "raise" else shown[-1]
    assert first.endswith(f"rank 1 {said}"), first
    for text in shown:
        assert text in run.stderr
    assert "runpy" not in run.stderr and "script_worker" not in run.stderr  # python's view
    assert "Traceback" not in (run.run_dir / "logs" / "rank_0.log").read_text()


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["segv", "sigkill"])
def test_a_rank_killed_by_a_signal_keeps_its_last_lines(tmp_path, mode):
    """What a rank wrote just before a segmentation fault or the OOM killer's SIGKILL was
    still in its pipe when it died, and the tee thread died with it: its log held none of
    it, the console neither (a user's find). The tee is a process now; a fault also prints
    the Python stack (faulthandler), as the script would have to ask torchrun for."""
    run = run_probe(tmp_path, "-m", "probepkg.probe", mode, str(tmp_path / "out"))
    signame = {"segv": "SIGSEGV", "sigkill": "SIGKILL"}[mode]
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"rank 1 was killed by {signame}" in run.stderr, run.stderr
    log = (run.run_dir / "logs" / "rank_1.log").read_text()
    assert "rank 1 line 1\nrank 1 line 2 on stderr\n" in log, log
    assert "rank 1 line 2 on stderr" in run.stderr  # the console too
    if mode == "segv":
        assert "Fatal Python error: Segmentation fault" in log, log
        assert "its Python stack is in logs/rank_1.log" in run.stderr
        assert "line" in log and "in reads_address_zero" in log, log


@pytest.mark.multiproc
def test_a_script_asking_for_nccl_without_cuda_is_told_what_works(tmp_path):
    """torch says only "Distributed package doesn't have NCCL built in"; the error line
    adds why (no CUDA here) and what runs on both CPU and GPU."""
    import torch

    if torch.cuda.is_available():  # this project's tests run on CPU; not an expected path
        pytest.skip("with CUDA, backend='nccl' starts: there is no error to explain")
    run = run_probe(tmp_path, "-m", "probepkg.probe", "nccl", str(tmp_path / "out"))
    assert run.returncode == 1, run.stdout + run.stderr
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    assert "NCCL" in first and "backend='nccl', which needs CUDA GPUs" in first, first
    assert "leave backend unset (torch picks gloo on CPU, nccl on CUDA)" in first, first
    # torch's own error, re-raised with the hint: one traceback, no frame of dtrain's
    # wrapper (a second traceback came below 'The above exception was the direct cause';
    # the script called torch's init_process_group, and its traceback says so)
    logs = [p.read_text() for p in sorted((run.run_dir / "logs").glob("rank_*.log"))]
    log = next(text for text in logs if "NCCL" in text)
    assert log.count("Traceback") == 1 and "direct cause" not in log, log
    assert "dtrain_cli/runtime/script/arrival.py" not in log, log
    assert "distributed_c10d.py" in log, log  # torch's frames stay


ALONE = """import argparse
p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=-1)
args = p.parse_args()
if args.local_rank == -1:
    print("training alone")
else:
    import torch.distributed as dist
    dist.init_process_group()
"""
SHARDS = """import os
print(f"shard-{os.environ['RANK']}")
"""

MESH_ONLY = """import torch
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh("cpu", (2,))
t = torch.ones(1)
torch.distributed.all_reduce(t)
print("sum", t.item())
"""


@pytest.mark.multiproc
def test_a_script_that_never_joins_a_process_group_is_told_its_ranks_ran_alone(tmp_path):
    """An older script that takes its rank from --local_rank (torchrun passes none) ran
    each of its ranks alone, exit 0, and nothing said so. The plan names the flag, and the
    end of the run says the group was never joined; a script whose group comes from
    init_device_mesh (no init_process_group of its own) joined it."""
    (tmp_path / "alone.py").write_text(ALONE)
    (tmp_path / "mesh_only.py").write_text(MESH_ONLY)
    run = run_dtrain(["run", "dp=2", "--", "alone.py"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("training alone") == 2
    assert "warning: script alone.py line 3 takes --local_rank" in run.stderr
    said = "warning: the script never called init_process_group: its 2 ranks ran alone"
    assert run.stderr.count(said) == 1, run.stderr  # rank 0 says it
    run = run_dtrain(["run", "dp=2", "--", "mesh_only.py"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("sum 2.0") == 2
    assert "init_process_group" not in run.stderr and "warning" not in run.stderr
    # a script that only splits its files by RANK, naming nothing distributed, is not told
    (tmp_path / "shards.py").write_text(SHARDS)
    run = run_dtrain(["run", "dp=2", "--", "shards.py"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("shard-0") == run.stdout.count("shard-1") == 1
    assert "warning" not in run.stderr, run.stderr


@pytest.mark.multiproc
def test_rank_that_never_arrives_is_named_after_the_rendezvous_timeout(tmp_path):
    start = time.time()
    run = run_probe(tmp_path, "launcher.rdzv_timeout_s=6", "-m", "probepkg.probe", "late", "out")
    assert run.returncode == 1, run.stdout + run.stderr
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    # rank 0 lost no peer (it said the first: "stopped answering; rank 0 then lost its peer"),
    # and its traceback through dtrain's wrapper is not shown: rank 1's log says more
    assert first == (
        "error: rank 1 never reached init_process_group: the others waited 6 s "
        "(launcher.rdzv_timeout_s); see logs/rank_1.log"
    ), first
    assert "arrival.py" not in run.stderr, run.stderr
    assert time.time() - start < 100  # not the process group's 30 minutes


@pytest.mark.multiproc
def test_restart_after_a_killed_rank(tmp_path):
    run = run_probe(
        tmp_path, "launcher.max_restarts=1", "-m", "probepkg.probe", "kill_once", "out", timeout=240
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result == {"restart": 1, "sum": 3.0}
    # the restart is said (it was silent), and the logs, appended to, mark where it began
    said = "dtrain: restarted (attempt 1 of 1) after rank 1 was killed by SIGKILL"
    assert said in run.stderr, run.stderr
    log = (run.run_dir / "logs" / "rank_0.log").read_text()
    first, _, second = log.partition("----- dtrain: restart attempt 1, ")
    lost = ("Connection reset by peer", "Connection closed by peer")  # gloo says either
    assert any(x in first for x in lost) and said in second, log


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*DTRAIN, *args],
        cwd=cwd,
        env={**env(), "PYTHONPATH": f"{REPO}:{SCRIPTS}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(paths: list[Path], timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not all(p.exists() for p in paths):
        assert time.time() < deadline, f"not written within {timeout} s: {paths}"
        time.sleep(0.1)


@pytest.mark.multiproc
def test_ctrl_c_leaves_no_process_of_the_script(tmp_path):
    out = tmp_path / "out"
    proc = _start(["run", "dp=2", "-m", "probepkg.probe", "hang", str(out)], tmp_path)
    try:
        pid_files = [out / f"pid_rank_{r}" for r in range(2)]
        _wait_for(pid_files)
        _wait_for([out / f"child_rank_{r}" for r in range(2)])
        pids = [int(p.read_text()) for p in pid_files]
        pids += [int((out / f"child_rank_{r}").read_text()) for r in range(2)]
        assert all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    deadline = time.time() + 5
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []


@pytest.mark.multiproc
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_preemption_signal_reaches_the_script_and_exit_75_is_recorded(tmp_path, start):
    out = tmp_path / "out"
    args = ["run", f"launcher.start_method={start}", "-m", "probepkg.probe", "preempt", str(out)]
    proc = _start(args, tmp_path)
    try:
        _wait_for([out / "pid_rank_0"])
        proc.send_signal(signal.SIGUSR1)  # what SLURM's --signal=B:USR1 does to the agent
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err
    assert (out / "checkpoint_rank_0").is_file()
    run_dir = next((tmp_path / "runs").iterdir())
    marker = json.loads((run_dir / "preempted.json").read_text())
    assert marker["by"] == "script" and marker["rank"] == 0
    # colleague's b: the message names the command that continues it, and it does
    said = f"`dtrain resume --ckpt {run_dir}` runs it again in its run directory"
    assert said in err.replace("\n", " "), err
    if start == "forkserver":
        resumed = run_dtrain(
            ["resume", str(run_dir)],  # the run written first, without --ckpt
            tmp_path,
            timeout=120,
            env={"PYTHONPATH": f"{REPO}:{SCRIPTS}"},
        )
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        seen = json.loads((out / "resumed_rank_0").read_text())
        assert seen == {"run_dir": str(run_dir)} and list((tmp_path / "runs").iterdir()) == [
            run_dir
        ]
        assert not (run_dir / "preempted.json").exists()
        assert (
            "----- dtrain: a new start (dtrain resume), "
            in (run_dir / "logs" / "rank_0.log").read_text()
        )
        # it ended well: resumed again, it ran the whole script once more in the same dir
        # (its outputs overwritten, exit 0); now refused in one line, nothing started
        assert json.loads((run_dir / "finished.json").read_text())["exit_code"] == 0
        again = run_dtrain(["resume", str(run_dir)], tmp_path, timeout=60)
        assert again.returncode == 2, again.stdout + again.stderr
        assert again.stderr.startswith(f"error: {run_dir}: its script finished (exit 0, ")
        assert "start a new one with dtrain run" in again.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "dp=2", "--", "nothere.py"], "script nothere.py: not found"),
        (["run", "dp=2", "--"], "nothing after --"),
        (["run", "dp=2"], "no script"),
        (["run", "-m", "no_such_pkg.train"], "module no_such_pkg.train: not found"),
        (["run", "broken.py"], "script broken.py: line 1"),
        (["run", "a_dir"], "script a_dir: not a file"),
        (["run", "-m", "brokenpkg.train"], "module brokenpkg.train ("),
        (["run", "dp=2", "--bogus", "train.py"], "--bogus: not an option of dtrain run"),
        (["plan", "dp=2", "--", "nothere.py"], "script nothere.py: not found"),
        (["sbatch", "dp=2", "--", "nothere.py"], "script nothere.py: not found"),
    ],
)
def test_bad_script_is_one_line_exit_2_and_nothing_started(tmp_path, args, says):
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("")
    (tmp_path / "brokenpkg" / "train.py").write_text("print('never'\n")
    (tmp_path / "train.py").write_text("print('never')\n")
    proc = subprocess.run(
        [*DTRAIN, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env()
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
    assert "Traceback" not in proc.stderr and "never" not in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_plan_of_a_script_shows_its_interpreter_and_only_what_applies(tmp_path, monkeypatch):
    """Colleague's e and f: launcher.python is the command's interpreter; no parameters,
    memory, step time, strategy or "saves at steps" of dtrain's trainer, only the plan's
    values a script may read through script_env."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("print('never')\n")
    args = ["plan", "launcher.python=/usr/bin/python3", "checkpoint.every_steps=50", "--", "x.py"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "/usr/bin/python3 x.py" in out and "python x.py" not in out.replace("python3", "")
    for trainer_only in ("parameters", "saves at steps", "MFU", "estimated on", "strategy"):
        assert trainer_only not in out, trainer_only
    assert "for your script, if it reads them (dtrain_cli.script_env)" in out
    assert "should_checkpoint(step)  │ at steps 50, 100" in out


def test_plan_shows_what_would_run(tmp_path):
    (tmp_path / "train.py").write_text("print('never')\n")
    proc = subprocess.run(
        [*DTRAIN, "plan", "dp=4", "launcher.max_restarts=2", "--", "train.py", "--epochs", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env(), "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "python train.py --epochs 3" in out and str(tmp_path / "train.py") in out
    assert "4 = 1 node(s) x 4" in out and "TORCHELASTIC_MAX_RESTARTS=2" in out
    assert "c10d at localhost:0" in out and "never" not in out
    assert not (tmp_path / "runs").exists()
    yaml_out = subprocess.run(
        [*DTRAIN, "plan", "-f", "yaml", "--", "train.py", "--epochs", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
    )
    from dtrain_cli.plan.plan import Plan

    plan = Plan.from_dict(__import__("yaml").safe_load(yaml_out.stdout))
    assert plan.script is not None and plan.script.argv() == ["train.py", "--epochs", "3"]


@pytest.mark.multiproc
def test_validate_cluster_first_then_the_script(tmp_path):
    run = run_dtrain(
        ["run", "--validate-cluster", "dp=2", "-m", "probepkg.probe", "dump", "out"],
        tmp_path,
        timeout=240,
        env={"PYTHONPATH": f"{REPO}:{SCRIPTS}", "COLUMNS": "200"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all_reduce" in run.stdout and "validate-cluster: ok" in run.stdout
    assert run.stdout.index("validate-cluster: ok") < run.stdout.index("dtrain -m probepkg")
    assert json.loads((tmp_path / "out" / "rank_1.json").read_text())["world"] == "2"


def test_failed_cluster_check_starts_nothing(tmp_path):
    (tmp_path / "root").write_text("a file, not a folder\n")  # the run root cannot be made
    (tmp_path / "train.py").write_text("open('ran', 'w')\n")
    run = run_dtrain(
        ["run", "--validate-cluster", "dp=2", f"run.root={tmp_path / 'root' / 'runs'}", "train.py"],
        tmp_path,
        timeout=120,
        env={"COLUMNS": "200"},
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "validate-cluster failed" in run.stderr and "the script was not started" in run.stderr
    assert not (tmp_path / "ran").exists() and (tmp_path / "root").is_file()


ENDS = SCRIPTS / "ends.py"
ENDINGS = [  # how a script can end -> (exit code of dtrain run, text it shows)
    ("end", 0, "rank 0 ends by end"),
    ("exit", 0, "rank 0 ends by exit"),
    ("exit0", 0, "rank 0 ends by exit0"),
    ("os_exit0", 0, "rank 0 ends by os_exit0"),
    ("exit3", 3, 'rank 0 exited with code 3 (its last line: "rank 0 ends by exit3")'),
    ("message", 1, "stopping: a message"),  # stdout and stderr: their order may vary
    ("raise", 1, "ValueError: ends by an exception"),
    # forkserver's wrapper took it for a clean end: exit 0 and finished.json
    ("interrupt", 1, "KeyboardInterrupt"),
]


@pytest.mark.multiproc
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
@pytest.mark.parametrize(("mode", "code", "says"), ENDINGS, ids=[e[0] for e in ENDINGS])
def test_every_way_a_script_ends_gives_its_exit_code(tmp_path, start, mode, code, says):
    """As ``python script.py`` would: ``sys.exit()`` and ``os._exit(0)`` are clean ends (the
    function entry of a forked worker waited for a return value that never came)."""
    run = run_dtrain(
        ["run", "dp=1", f"launcher.start_method={start}", "--", str(ENDS), mode],
        tmp_path,
        timeout=120,
        warm=True,
    )
    assert run.returncode == code, run.stdout + run.stderr
    assert says in run.stdout + run.stderr
    assert f"rank 0 ends by {mode}" in (run.run_dir / "logs" / "rank_0.log").read_text()


@pytest.mark.multiproc
def test_each_rank_draws_its_own_random_numbers_run_after_run(tmp_path):
    """As each ``python train.py`` of torchrun: ranks forked from one server drew the same
    numbers (random, numpy, torch), and the warm pool gave them again the next run."""
    draws = []
    for attempt in range(2):
        args = ["run", "dp=2", f"run.name=draws{attempt}", "--", str(ENDS), "draws"]
        run = run_dtrain(args, tmp_path, timeout=120, warm=True)
        assert run.returncode == 0, run.stdout + run.stderr
        draws += [line.split(" draws ")[1] for line in run.stdout.splitlines() if " draws " in line]
    assert len(draws) == 4, draws
    for generator in range(3):  # random (reseeded at fork by Python itself), numpy, torch
        assert len({d.split()[generator] for d in draws}) == 4, draws


@pytest.mark.multiproc
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_rank_that_exits_3_while_its_peer_waits_is_named_with_its_code(tmp_path, start):
    """The agent's SIGTERM to the waiting rank is no cause; rank 1's exit code is ours."""
    args = ["run", "dp=2", f"launcher.start_method={start}", "--", str(ENDS)]
    run = run_dtrain([*args, "exit3_in_barrier"], tmp_path, timeout=120, warm=True)
    assert run.returncode == 3, run.stdout + run.stderr
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    assert first.startswith("error: rank 1 exited with code 3"), first
    assert "SIGTERM" not in first


@pytest.mark.multiproc
def test_lines_of_ranks_never_splice(tmp_path):
    run = run_dtrain(["run", "dp=2", "--", str(ENDS), "lines"], tmp_path, timeout=120, warm=True)
    assert run.returncode == 0, run.stderr
    whole = re.compile(r"\[rank [01]\] line \d{3} x{40}")
    lines = [line for line in run.stdout.splitlines() if line.startswith("[rank")]
    assert len(lines) == 600 and all(whole.fullmatch(line) for line in lines)
    for rank in range(2):
        log = (run.run_dir / "logs" / f"rank_{rank}.log").read_text().splitlines()
        # rank 0 says that the script's ranks, which join no group, ran alone
        alone = [line for line in log if "never called init_process_group" in line]
        assert len(alone) == (1 if rank == 0 else 0)
        assert len(log) == 302 + len(alone) and f"[rank {rank}] to stderr" in log
        body = [line for line in log if line.startswith("[rank") and "stderr" not in line]
        assert len(body) == 300 and all(whole.fullmatch(line) for line in body)


@pytest.mark.multiproc
def test_nothing_dtrain_started_outlives_it(tmp_path):
    """A child the script left running, the fork server, the resource tracker: all gone
    when ``dtrain run`` returns."""
    proc = subprocess.Popen(
        [*DTRAIN, "run", "dp=2", "--", str(ENDS), "leave_a_child"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        start_new_session=True,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    children = [int(line.split()[1]) for line in out.splitlines() if line.startswith("child ")]
    assert len(children) == 2
    assert session_processes(proc.pid) == []


@pytest.mark.multiproc
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_ctrl_c_ends_the_run_while_a_rank_waits_in_c_code(tmp_path, start):
    """Rank 0 waits in a c10d store (C code, where Python runs no signal handler) for rank
    1: Ctrl-C still ends the run within seconds, not after the agent's 30 s grace."""
    out = tmp_path / "out"
    out.mkdir()
    args = ["run", "dp=2", f"launcher.start_method={start}", "--", str(ENDS), "wait_in_c"]
    proc = subprocess.Popen(
        [*DTRAIN, *args, str(out)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        start_new_session=True,
    )
    try:
        _wait_for([out / "started_0", out / "started_1"])
        time.sleep(1.0)  # rank 0 is in the store wait by now
        pressed = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert took < 10, f"{took:.1f} s"
    assert "rank 0: stopped by SIGINT (the main thread is inside a C call" in err


@pytest.fixture(scope="module")
def other_venv(tmp_path_factory) -> Path:
    """Another environment, with a package dtrain's does not have."""
    root = tmp_path_factory.mktemp("othervenv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "onlyhere.py").write_text('WHERE = "the other venv"\n')
    return python


@pytest.mark.multiproc
def test_launcher_python_runs_the_script_under_another_interpreter(tmp_path, other_venv):
    (tmp_path / "uses_other.py").write_text(
        "import os, sys\nimport onlyhere\n"
        "print('rank', os.environ['RANK'], sys.prefix, onlyhere.WHERE)\n"
    )
    run = run_dtrain(
        ["run", "dp=2", f"launcher.python={other_venv}", "--", "uses_other.py"], tmp_path
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in range(2):
        assert f"rank {rank} {other_venv.parent.parent} the other venv" in run.stdout
    missing = run_dtrain(["run", "dp=1", "--", "uses_other.py"], tmp_path)
    assert missing.returncode == 1
    first = next(line for line in missing.stderr.splitlines() if line.startswith("error:"))
    assert "ModuleNotFoundError: No module named 'onlyhere'" in first
    assert f"the script ran under {sys.executable}" in first and "launcher.python=" in first


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "launcher.python=nope", "--", "t.py"], "launcher.python=nope: not found"),
        (["plan", "launcher.python=python3"], "launcher.python=python3: only your own script"),
    ],
)
def test_launcher_python_mistakes_are_one_line(tmp_path, args, says):
    (tmp_path / "t.py").write_text("print('never')\n")
    proc = subprocess.run(
        [*DTRAIN, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env()
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and says in proc.stderr
    assert not (tmp_path / "runs").exists()


KILLED_THEN_PEER_LOST = """import os, signal, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)  # an OOM kill, a kill -9
dist.all_reduce(t)  # rank 0: its peer is gone
"""


@pytest.mark.multiproc
def test_a_killed_rank_is_named_when_its_peer_died_at_the_same_poll(tmp_path):
    """Both dead when torch's agent next looks (every 3 s here): it took rank 0, first in
    its list, as the failure, and the report said rank 1 'ended without an error of its own
    (killed by a signal?)'; every process that failed by itself is reported now."""
    (tmp_path / "race.py").write_text(KILLED_THEN_PEER_LOST)
    run = run_dtrain(["run", "dp=2", "launcher.monitor_interval_s=3", "--", "race.py"], tmp_path)
    assert run.returncode != 0
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    assert first.startswith("error: rank 1 was killed by SIGKILL; rank 0 then lost its peer"), first
