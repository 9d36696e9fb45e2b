"""The README's command blocks stay true: every ``dtrain plan``/``dtrain launch`` line is
planned exactly as written (exit 0), and the launches of the small models run for a few
steps. Lines that name the reader's own files, hosts or runs (placeholders such as
``runs/<run>`` or ``/models/my-llama``) cannot run here and are listed as such."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from conftest import REPO, run_dtrain

# What a reader substitutes: their runs, model folders, corpora, hosts and cluster sites.
PLACEHOLDERS = (
    *("<run>", "/models/", "corpus.jsonl", "shards/", "my_data.", "node0", "mysite"),
    *("train.py", "mypkg."),  # your own training script (dtrain run)
)
SMALL = ("recipe=gpt_tiny", "recipe=cnn_bn", "recipe=my_experiment", "recipe=llama_tiny_hf")
FEW_STEPS = ["train.steps=2", "train.eval_every=0", "logging.every=1", "checkpoint.at_end=false"]


def readme_commands() -> list[tuple[str, list[str]]]:
    """(folder, argv) of each dtrain line in the README's code blocks, in order; a
    ``cd DIR`` line in a block applies to the lines after it."""
    text = (REPO / "README.md").read_text()
    out = []
    for lang, block in re.findall(r"^ *```([\w-]*)\n(.*?)^ *```", text, re.S | re.M):
        if lang not in ("", "bash", "sh", "console"):  # python, yaml: not commands
            continue
        cwd = "."
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("cd "):
                cwd = line[3:].strip()
            elif line.startswith("dtrain "):
                out.append((cwd, shlex.split(line)[1:]))
    return out


COMMANDS = [
    (cwd, argv)
    for cwd, argv in readme_commands()
    if argv[0] in ("plan", "launch") and not any(p in " ".join(argv) for p in PLACEHOLDERS)
]


def workdir(tmp_path, cwd: str):
    if cwd == "examples":
        dest = tmp_path / "examples"
        shutil.copytree(REPO / "examples", dest, ignore=shutil.ignore_patterns("runs"))
        return dest
    return tmp_path


def test_the_readme_has_the_commands_this_test_reads():
    assert len(COMMANDS) >= 25
    assert any(argv[0] == "launch" and "recipe=my_experiment" in argv for _, argv in COMMANDS)


@pytest.mark.parametrize(("cwd", "argv"), COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_every_readme_command_plans_as_written(tmp_path, monkeypatch, cwd, argv):
    """In-process (the CLI's own entry point, without a Python start per command)."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(workdir(tmp_path, cwd))
    result = CliRunner().invoke(app, ["plan", *argv[1:]])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "runs").exists()


LAUNCHES = [(c, a) for c, a in COMMANDS if a[0] == "launch" and any(s in a for s in SMALL)]


@pytest.mark.multiproc
@pytest.mark.parametrize(("cwd", "argv"), LAUNCHES, ids=[" ".join(a) for _, a in LAUNCHES])
def test_readme_launches_of_small_models_run(tmp_path, cwd, argv):
    run = run_dtrain([*argv, *FEW_STEPS], workdir(tmp_path, cwd), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(run.metrics()) == 2
