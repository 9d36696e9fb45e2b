"""The CLI as users run it (subprocess): no torch import for help and plan, exit codes,
Ctrl-C, the wheel. In-process (CliRunner): tests/unit/test_cli.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from tests.conftest import DTRAIN, REPO, cache_dir, run_dtrain


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "recipe=gpt_tiny", "dp=2", "train.global_batch_size=7"],
        ["launch", "recipe=gpt_tiny", "precision=fp16"],
    ],
)
def test_bad_input_exit_2_one_line_no_traceback_nothing_written(args, tmp_path, monkeypatch):
    """In-process, as tests/unit/test_cli.py's plan cases; a launch starts the fork server
    before it checks, so here."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.count("error:") >= 1
    assert not (tmp_path / "runs").exists()


def test_help_and_plan_do_not_import_torch():
    code = (
        "import sys\n"
        "from dtrain_cli.cli.app import app\n"
        "for args in (['--help'], ['plan', 'recipe=gpt_small', 'dp=2'],\n"
        "             ['advise', 'recipe=gpt_small', 'hardware=h100_80g', '--json']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), e.code\n"
        "print('TORCH_LOADED' if 'torch' in sys.modules else 'NO_TORCH')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("NO_TORCH")


def test_subprocess_plan_and_bad_override(tmp_path):
    ok = run_dtrain(["plan", "recipe=gpt_small", "dp=2"], tmp_path)
    assert ok.returncode == 0 and "14,491,392" in ok.stdout
    bad = run_dtrain(["plan", "recipe=gpt_small", "dp=2", "train.stepz=3"], tmp_path)
    assert bad.returncode == 2
    assert "unknown key 'train.stepz'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.multiproc
def test_token_ids_past_the_vocabulary_are_refused_before_a_rank_starts(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (np.arange(20_000, dtype=np.uint16) % 600).tofile(data / "train.bin")
    (np.arange(2_000, dtype=np.uint16) % 600).tofile(data / "val.bin")
    run = run_dtrain(
        [
            "launch",
            "recipe=gpt_tiny",
            "dp=2",
            "data=tokens",
            f"data.path={data}",
            "train.steps=3",
            "optim.warmup_steps=0",
        ],
        tmp_path,
    )
    # said by the launcher before any worker starts (it failed in each rank's start-up)
    assert run.returncode == 2, run.stderr
    assert "token id 599 in train.bin >= model.vocab_size=256; set model.vocab_size above 599" in (
        run.stderr
    )
    assert "rank" not in run.stderr and not (tmp_path / "runs").exists()


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.multiproc
def test_ctrl_c_stops_every_worker(tmp_path):
    env = {**os.environ, "DTRAIN_CACHE": str(cache_dir())}
    proc = subprocess.Popen(
        [*DTRAIN, "launch", "recipe=gpt_tiny", "dp=2", "train.steps=100000", "logging.every=1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        log = None
        while time.time() < deadline:
            logs = list(tmp_path.glob("runs/*/logs/rank_1.log"))
            if logs and "step" in (log := logs[0]).read_text():
                break
            time.sleep(0.2)
        else:
            pytest.fail("no training step within 120 s")
        workers = _descendants(proc.pid)
        assert len(workers) >= 2
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    deadline = time.time() + 5  # helpers (the fork server) exit as the launcher does
    while [p for p in workers if _alive(p)] and time.time() < deadline:
        time.sleep(0.1)
    assert [p for p in workers if _alive(p)] == []
    assert log is not None


CAUGHT_INTERRUPT_THEN_130 = """
import ctypes, sys
import dtrain_cli.cli.app as cli

run = ctypes.pythonapi.PyRun_String  # C code running Python, as `import torch` does
run.restype = ctypes.py_object
run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
try:
    run(b"raise KeyboardInterrupt", 257, {}, {})  # a Ctrl-C there...
except KeyboardInterrupt:
    pass  # ...caught, as the launch command catches one during start-up
cli.app = lambda: sys.exit(130)  # the command then reports it: exit 130
cli.main()
"""


def test_a_ctrl_c_caught_during_start_up_exits_130_not_by_sigint(tmp_path):
    """CPython remembers a KeyboardInterrupt raised while C code ran Python even after it
    was caught, and `python -m` would then end the process by SIGINT (-2, 4 of 30 Ctrl-C's
    in start-up under load): the command's own 130 must come out."""
    (tmp_path / "caught_interrupt.py").write_text(CAUGHT_INTERRUPT_THEN_130)
    proc = subprocess.run(
        [sys.executable, "-m", "caught_interrupt"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 130, proc.stderr


def test_wheel_carries_configs_and_recipes(tmp_path):
    """Build the wheel, install it alone into a folder, and run `dtrain recipes` from it."""
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("dtrain-*.whl"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target), "COLUMNS": "500"}
    out = subprocess.run(
        [sys.executable, "-m", "dtrain_cli", "recipes"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "gpt_small" in out.stdout and str(target) in out.stdout
    plan = subprocess.run(
        [sys.executable, "-m", "dtrain_cli", "plan", "recipe=gpt_small", "--format", "yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert plan.returncode == 0 and "gpt_small" in plan.stdout
    json.dumps(plan.stdout)


def test_resume_checks_the_checkpoint_path_before_starting_anything(tmp_path, monkeypatch):
    """Colleague's i: a wrong --ckpt is one line, exit 2, before the fork server (which
    imports torch) is started."""
    from dtrain_cli.launch import worker_server

    started = []
    monkeypatch.setattr(worker_server, "start", lambda *a, **k: started.append(a))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["resume", "--ckpt", "runs/nope"])
    assert result.exit_code == 2, result.output
    assert "runs/nope: no such file or folder" in result.output
    assert started == [] and not (tmp_path / "runs").exists()


def test_a_repeated_plan_imports_neither_hydra_nor_omegaconf(tmp_path):
    """The typed composition kept on disk (dtrain_cli/config/compose_cache.py): ``dtrain
    plan`` run again prints the same plan without importing Hydra, OmegaConf or YAML."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] for m in sys.modules}"
        " & {'omegaconf', 'hydra', 'yaml', 'antlr4', 'torch'})))\n"
        "sys.argv = ['dtrain', 'plan', 'recipe=gpt_small', 'dp=4', 'pp=2']\n"
        "from dtrain_cli.cli.entry import main\nmain()\n"
    )
    env = {**os.environ, "DTRAIN_CACHE": str(tmp_path / "cache")}
    runs = [
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert "LOADED ['antlr4', 'hydra', 'omegaconf', 'yaml']" in runs[0].stdout  # composed
    assert "LOADED []" in runs[1].stdout
    assert runs[0].stdout.split("LOADED")[0] == runs[1].stdout.split("LOADED")[0]
