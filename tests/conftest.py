"""Shared helpers of both rooms (tests/rooms.py says what goes where). Multi-process
launches are expensive (~5 s each on 2 cores): tests that only read a run's outputs share one
launch through session-scoped fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.rooms import room

REPO = Path(__file__).resolve().parent.parent
DTRAIN = [sys.executable, "-m", "dtrain_cli"]

# No warm worker pool (dtrain_cli/launch/warm_pool.py) for the launches of the tests: the
# launch room forks its launches from its own warm launcher (tests/warm_launcher.py), and a
# pool outlives the launch that started it. tests/launch/test_warm_pool.py turns it on.
os.environ.setdefault("DTRAIN_WARM_POOL", "0")


SERIAL_FILES = frozenset({"test_slurm.py", "test_slurm_elastic.py", "test_slurm_script_run.py"})
"""Launch tests that share one machine-wide service (the local SLURM cluster: its two
nodes, its queue): ``serial``, run one at a time after the rest of the launch room."""


LONGEST_FIRST = (
    "test_strategies.py",
    "test_parallel.py",
    "test_k8s_replay.py",
    "test_warm_pool.py",
    "test_script_run.py",
    "test_elastic_live.py",
    "test_async_sync.py",
    "test_script_corpus.py",
    "test_simulate.py",
)
"""Launch-room files that take longest (module fixtures of several launches; CI prints the
slowest tests): collected first, so ``--dist loadfile`` hands them out first and the room
does not end with one worker running a long file while the other core idles. The order
of the tests inside a file is kept."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of tests/launch is ``multiproc``: ``-m "not multiproc"`` is the unit room;
    those of :data:`SERIAL_FILES` are ``serial`` too. :data:`LONGEST_FIRST` go first."""
    for item in items:
        if room(item.path) == "launch":
            item.add_marker(pytest.mark.multiproc)
            if item.path.name in SERIAL_FILES:
                item.add_marker(pytest.mark.serial)

    def weight(item: pytest.Item) -> int:
        name = item.path.name
        if room(item.path) == "launch" and name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST)

    items.sort(key=weight)  # stable: each file's own order stays


@dataclass
class Run:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path | None

    def metrics(self, kind: str = "train") -> list[dict]:
        assert self.run_dir is not None
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    def summary(self) -> dict:
        assert self.run_dir is not None
        return json.loads((self.run_dir / "summary.json").read_text())


WARM_COMMANDS = frozenset({"launch", "resume", "simulate"})
"""Forked from the warm launcher (tests/warm_launcher.py) unless ``fresh=True`` or
``DTRAIN_TEST_FRESH=1``: the same launch without importing torch twice per test (a
simulate's ranks: their fork server forked from it, torch imported)."""


def run_dtrain(
    args: list[str],
    cwd: Path,
    timeout: float = 300,
    env: dict | None = None,
    *,
    fresh: bool = False,
    warm: bool = False,
) -> Run:
    """``python -m dtrain_cli ARGS`` in ``cwd``: its exit code, output and newest run dir.
    ``warm=True`` forks another command (``dtrain run``) from the warm launcher too: for the
    tests of how a script's run ends, not of what a fresh interpreter's script sees."""
    full_env = {**os.environ, "DTRAIN_CACHE": str(cache_dir()), **(env or {})}
    warm = not fresh and (warm or (args[:1] and args[0] in WARM_COMMANDS))
    if warm and os.environ.get("DTRAIN_TEST_FRESH") != "1":
        from tests.warm_launcher import warm_launcher

        proc = warm_launcher().run(args, cwd, full_env, timeout)
    else:
        proc = subprocess.run(
            [*DTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env
        )
    run_dir = None
    runs = cwd / "runs"
    if runs.is_dir():
        dirs = sorted(runs.iterdir(), key=lambda p: p.stat().st_mtime)
        run_dir = dirs[-1] if dirs else None
    return Run(args, proc.returncode, proc.stdout, proc.stderr, run_dir)


TORCH_EXIT_ABORT = "terminate called without an active exception"


def wait_for_checkpoint(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120):
    """Until the run's checkpoint of ``step`` is complete (its meta.json), ``proc`` (the
    launcher training it) still running."""
    import time

    meta = run_dir / "checkpoints" / f"step_{step:06d}" / "meta.json"
    deadline = time.time() + timeout
    while not meta.exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)


def run_reference(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    """A reference run under plain torchrun (or torch's spawn), run again (up to 3 runs in
    all) when torch itself aborted a rank (SIGABRT, ``terminate called without an active
    exception``: a gloo thread still joinable at a process group's teardown in torch 2.13,
    seen in 2 of 4 clean-clone CI runs of this suite, in scripts that had finished their
    work; once twice in a row, for 4 ranks on 2 loaded cores). dtrain's own runs are never
    run again: the comparison is with a reference that completed."""
    for _attempt in range(3):  # again only after torch aborted the previous one
        proc = subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
        if proc.returncode == 0 or TORCH_EXIT_ABORT not in proc.stderr:
            break
    return proc


def session_processes(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a command started with
    ``start_new_session=True``: everything it started that did not leave it)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def cache_dir() -> Path:
    """One corpus cache for the whole session (tokenizing the stdlib once)."""
    path = Path(os.environ.get("DTRAIN_TEST_CACHE", "/tmp/dtrain-test-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch(
    tmp_path_factory: pytest.TempPathFactory, name: str, *overrides: str, fresh: bool = False
) -> Run:
    cwd = tmp_path_factory.mktemp(name)
    run = run_dtrain(["launch", *overrides], cwd, fresh=fresh)
    assert run.returncode == 0, f"launch failed:\n{run.stdout}\n{run.stderr}"
    return run


# The math: same model, data and global batch (8); dp=1 accumulates 2 micro-batches of 4,
# dp=2 runs one micro-batch of 4 per rank. Logged every step.
# A small GPT (1 layer, width 64) for 300 steps: the runs a preemption signal interrupts
# (tests/launch/test_cluster_live.py, tests/launch/test_slurm.py).
TINY_PREEMPTIBLE = [
    "recipe=gpt_tiny",
    "model.n_layer=1",
    "model.n_embd=64",
    "model.n_head=2",
    "model.block_size=64",
    "dp=2",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "train.steps=300",
    "train.eval_every=0",
    "logging.every=5",
    "logging.tensorboard=false",
    "optim.warmup_steps=0",
]


MATH = [
    "recipe=gpt_tiny",
    "train.steps=10",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "logging.every=1",
    "train.eval_every=5",
    "logging.tensorboard=true",
    "debug.replica_check_at_end=true",  # param_digest, replicas_identical
]


@pytest.fixture(scope="session")
def run_dp1(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return launch(tmp_path_factory, "dp1", *MATH, "dp=1")


@pytest.fixture(scope="session")
def run_dp2(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The README's launch as a user starts it: a fresh ``python -m dtrain_cli``."""
    return launch(tmp_path_factory, "dp2", *MATH, "dp=2", fresh=True)


@pytest.fixture(scope="session")
def hf_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """A JSONL corpus, the tokenizer trained on it, and its vocabulary size (tests/hf_corpus.py)."""
    from tests.hf_corpus import train_tokenizer, write_corpus

    root = tmp_path_factory.mktemp("hfdata")
    corpus = write_corpus(root / "corpus.jsonl")
    vocab = train_tokenizer(corpus, root / "tok")
    return corpus, root / "tok", vocab
