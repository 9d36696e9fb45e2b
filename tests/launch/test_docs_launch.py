"""The documented commands that need workers, each code path once (tests/unit/test_docs.py plans
every other line):

- the README's quick start: its ``dtrain launch`` (a few steps), then every
  ``runs/<run>`` line of the docs against that run: ``checkpoints``, ``export``,
  ``report``, ``compare`` in-process, and the quick start's ``dtrain resume``;
- the README's ``dtrain run`` of examples/train.py, as written.

Launched as written elsewhere, so not again here: ``cd examples && dtrain launch
recipe=my_experiment --config-dir conf dp=2`` (tests/launch/test_own_model.py), the Hugging Face
recipes under dp, fsdp, tp and pp (tests/launch/test_hf_launch.py), ``recipe=cnn_bn
parallel.sync_batchnorm=true`` (tests/launch/test_sync_batchnorm.py), the fault drills
(tests/unit/test_failures.py, tests/launch/test_diagnose.py).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.conftest import run_dtrain
from tests.doc_commands import REPO, RUN, doc_commands

pytestmark = pytest.mark.multiproc

COMMANDS = [c for c in doc_commands() if c.expected is None]
README = [c for c in COMMANDS if c.file == "README.md"]
QUICK_LAUNCH = next(c for c in README if c.argv[0] == "launch" and "recipe=gpt_tiny" in c.argv)
QUICK_RESUME = next(c for c in README if c.argv[0] == "resume" and RUN in c.text)
QUICK_SCRIPT = next(c for c in README if c.argv[0] == "run" and "examples/train.py" in c.argv)
FEW_STEPS = ["train.steps=2", "train.eval_every=0", "logging.every=1"]
# A runs/<run> line needs a run of its kind: an HF export an HF run, a join an elastic one.
OTHER_RUNS = ("--format hf", "--join")
IN_PROCESS = sorted(
    {
        c.argv: c
        for c in COMMANDS
        if RUN in c.text
        and c.argv[0] in ("checkpoints", "export", "report", "compare")
        and not any(o in c.text for o in OTHER_RUNS)
    }.values(),
    key=lambda c: c.id,
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The quick start's launch (its run dir ends in a checkpoint)."""
    cwd = tmp_path_factory.mktemp("quick")
    run = run_dtrain([*QUICK_LAUNCH.argv, *FEW_STEPS], cwd)
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(run.metrics()) == 2
    return run


def with_run(argv: tuple[str, ...], run_dir) -> list[str]:
    """The placeholder run (and any other run it is compared with) is the quick start's;
    a checkpoint step named in the docs is its newest one."""
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    name = f"runs/{run_dir.name}"
    return [
        re.sub(r"step_\d{6}", latest, a.replace(RUN, name).replace("runs/<other-run>", name))
        for a in argv
    ]


@pytest.mark.parametrize("cmd", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
def test_run_dir_commands_work_as_written(quick_run, monkeypatch, cmd):
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(quick_run.run_dir.parent.parent)
    argv = with_run(cmd.argv, quick_run.run_dir)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, f"{cmd.id}: dtrain {' '.join(argv)}\n{result.output}"


def test_the_quick_start_resume_continues_the_run(quick_run):
    run_dir = quick_run.run_dir
    argv = [*with_run(QUICK_RESUME.argv, run_dir), "train.steps=3"]  # after the doc's steps
    resumed = run_dtrain(argv, run_dir.parent.parent)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [m["step"] for m in resumed.metrics()][-1] == 3
    (line,) = (run_dir / "resumes.jsonl").read_text().splitlines()
    assert json.loads(line)["step"] == 2


def test_the_example_script_runs_as_written(tmp_path):
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    run = run_dtrain(list(QUICK_SCRIPT.argv), tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step 20  loss" in run.stdout
    assert (run.run_dir / "logs" / "rank_1.log").exists()
