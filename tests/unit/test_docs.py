"""README.md and docs/*.md stay true, without starting a worker (tests/doc_commands.py says
how commands are read):

- every ``dtrain plan``/``launch``/``run`` line is planned exactly as written, in-process
  (``dtrain plan`` with the same arguments); ``sbatch`` lines are rendered with
  ``--dry-run``; ``advise``, ``recipes``, ``env`` and ``--help`` lines run as written;
- every ``$ dtrain ...`` line of a console block prints the lines under it (exit 2 for an
  ``error:``);
- every relative link points at a file (and a heading, when it names one);
- ``dtrain --help`` and every command's ``--help`` name an existing guide.

The ``runs/<run>`` lines and the launches of the example script: tests/launch/test_docs_launch.py;
the documented errors of launch, run and resume lines: tests/launch/test_docs.py.
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.conftest import cache_dir
from tests.doc_commands import NOT_RUN, REPO, RUN, Command, anchors, doc_commands, doc_files, links

COMMANDS = doc_commands()
IN_PROCESS = ("plan", "launch", "run", "sbatch", "advise", "recipes", "env", "--help", "k8s")
NEEDS_A_RUN = ("resume", "checkpoints", "export", "report", "compare")

# Each distinct (folder, command) once: the README repeats a guide's command on purpose.
_seen: set[tuple[str, tuple[str, ...]]] = set()
RUNNABLE: list[Command] = []
for _c in COMMANDS:
    key = (_c.cwd, _c.argv)
    runs_here = _c.expected is None and not _c.placeholder and _c.argv[0] in IN_PROCESS
    if _c.argv[0] == "k8s":  # only what prints or writes a manifest: the rest needs a cluster
        runs_here = runs_here and bool({"--dry-run", "--out"} & set(_c.argv))
    # advise --simulate starts a process per layout (simulated ranks: tests/launch/test_simulate.py)
    runs_here = runs_here and "--simulate" not in _c.argv
    if runs_here and key not in _seen:
        _seen.add(key)
        RUNNABLE.append(_c)
CONSOLE = [c for c in COMMANDS if c.expected is not None]


def workdir(tmp_path, cwd: str):
    """A scratch folder holding a copy of examples/ (so ``examples/train.py`` and
    ``cd examples`` work as in a checkout), and the folder the command runs in."""
    shutil.copytree(
        REPO / "examples",
        tmp_path / "examples",
        ignore=shutil.ignore_patterns("runs", "__pycache__"),
    )
    return tmp_path / cwd


def as_run_here(argv: tuple[str, ...]) -> list[str]:
    """What is run for a documented command: ``launch``/``run`` as ``plan`` (the same
    arguments; ``run``'s ``--validate-cluster`` is a launch-time check), ``sbatch`` with
    ``--dry-run`` instead of ``--submit``."""
    cmd, rest = argv[0], list(argv[1:])
    if "--help" in argv:
        return list(argv)
    if cmd in ("launch", "run"):
        return ["plan", *(a for a in rest if a != "--validate-cluster")]
    if cmd == "sbatch":
        rest = ["--dry-run" if a == "--submit" else a for a in rest]
        return ["sbatch", *rest] if "--dry-run" in rest else ["sbatch", *rest, "--dry-run"]
    return [cmd, *rest]


def invoke(argv: list[str]):
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    return CliRunner().invoke(app, argv)


def test_the_docs_have_the_commands_this_test_reads():
    files = {c.file for c in COMMANDS}
    guides = {str(p.relative_to(REPO)) for p in doc_files() if p.parent.name == "docs"}
    assert "README.md" in files
    # every guide opens with commands (ARCHITECTURE.md is the developers' map, not a guide)
    assert guides - {"docs/ARCHITECTURE.md", "docs/kubernetes.md"} <= files
    assert len(RUNNABLE) >= 60 and len(CONSOLE) >= 30
    known = {*IN_PROCESS, *NEEDS_A_RUN, *NOT_RUN}
    assert not [c.id for c in COMMANDS if c.argv[0] not in known and c.argv[0] != "--version"]


@pytest.mark.parametrize("cmd", RUNNABLE, ids=[c.id for c in RUNNABLE])
def test_every_doc_command_runs_as_written(tmp_path, monkeypatch, cmd):
    """In-process (the CLI's own entry point, without a Python start per command); nothing
    is written."""
    monkeypatch.setenv("DTRAIN_CACHE", str(cache_dir()))
    monkeypatch.chdir(workdir(tmp_path, cmd.cwd))
    result = invoke(as_run_here(cmd.argv))
    assert result.exit_code == 0, f"{cmd.id}: dtrain {cmd.text}\n{result.output}"
    assert not list(tmp_path.rglob("runs")), f"{cmd.id} wrote a run directory"


# ``launch``/``run``/``resume`` start the workers' fork server before they check anything:
# those run as a subprocess, in tests/launch/test_docs.py; the rest here, in-process.
STARTS_A_PROCESS = ("launch", "run", "resume")
CONSOLE_IN_PROCESS = [c for c in CONSOLE if c.argv[0] not in STARTS_A_PROCESS]


def assert_printed(cmd: Command, code: int, output: str) -> None:
    """The console block's lines are printed, no ``error:`` line it leaves out, exit 2 for
    an error."""
    from tests.doc_commands import matches

    printed = [line.strip() for line in output.splitlines()]
    missing = [e for e in cmd.expected if not any(matches(e, p) for p in printed)]
    assert not missing, f"{cmd.id}: dtrain {cmd.text}\nprinted:\n{output}"
    untold = [
        p
        for p in printed
        if p.startswith("error:") and not any(matches(e, p) for e in cmd.expected)
    ]
    assert not untold, f"{cmd.id}: the docs leave out {untold}"
    if any(e.startswith("error:") for e in cmd.expected):
        assert code == 2, f"{cmd.id}: exit {code}\n{output}"


@pytest.mark.parametrize("cmd", CONSOLE_IN_PROCESS, ids=[c.id for c in CONSOLE_IN_PROCESS])
def test_every_documented_error_is_what_dtrain_prints(tmp_path, monkeypatch, cmd):
    """In-process; ``launch``/``run``/``resume`` in tests/launch/test_docs.py."""
    monkeypatch.chdir(workdir(tmp_path, cmd.cwd))
    result = invoke(list(cmd.argv))
    assert_printed(cmd, result.exit_code, result.output)


# The Kubernetes guide comes with the k8s branch; until it is merged its link is allowed
# to point at nothing (then it is checked as any other).
def test_every_relative_link_points_at_a_file_and_heading():
    bad = []
    for path in doc_files():
        for line, target in links(path):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.relative_to(REPO)}:{line}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{path.relative_to(REPO)}:{line}: {target}: no such heading")
    assert not bad, "\n".join(bad)


def command_names() -> list[str]:
    from dtrain_cli.cli.app import app

    return [c.name or c.callback.__name__ for c in app.registered_commands]


@pytest.mark.parametrize("name", [None, *command_names()])
def test_every_command_help_names_its_guide(name):
    """``Guide: FILE`` at the end of each help text; every ``*.md`` it names exists."""
    result = invoke(["--help"] if name is None else [name, "--help"])
    assert result.exit_code == 0, result.output
    text = re.sub(r"[│╭╰─╮╯]", " ", result.output)
    guides = re.findall(r"Guides?: *([\w./-]+\.md)", text)
    assert guides, f"dtrain {name or ''} --help names no guide:\n{result.output}"
    for doc in re.findall(r"[\w./-]+\.md\b", text):
        assert (REPO / doc).exists(), f"dtrain {name} --help: {doc} missing"


def test_run_dir_lines_are_the_ones_test_docs_launch_runs():
    """Lines with the placeholder run are run against a real run elsewhere; the list here
    shows nothing else hides behind it."""
    with_run = [c for c in COMMANDS if RUN in c.text]
    assert with_run and {c.argv[0] for c in with_run} <= {*NEEDS_A_RUN, "sbatch"}


def test_python_in_the_docs_imports():
    """``from dtrain_cli... import NAME`` lines of the docs' python blocks: the module
    imports and has NAME (a module that moved breaks the docs, not only the code)."""
    import importlib

    bad = []
    for path in doc_files():
        for block in re.findall(r"^ *```python\n(.*?)^ *```", path.read_text(), re.S | re.M):
            for module, names in re.findall(
                r"^ *from (dtrain_cli[\w.]*) import ([\w, ]+)", block, re.M
            ):
                mod = importlib.import_module(module)
                for name in names.split(", "):
                    try:  # a name in the module, or a submodule of a package
                        getattr(mod, name, None) or importlib.import_module(f"{module}.{name}")
                    except ImportError:
                        bad.append(f"{path.name}: from {module} import {name}")
    assert not bad


def test_repository_paths_in_the_docs_exist():
    """Code spans that name a file or folder of this repository (``dtrain_cli/...``,
    ``configs/...``, ``tests/...``) point at one; patterns with ``<`` or ``*`` are not paths."""
    tops = ("dtrain_cli", "tests", "configs", "recipes", "examples", "bench", "docs")
    bad = []
    for path in doc_files():
        for span in re.findall(r"`([^`\s]+)`", path.read_text()):
            span = span.split("::")[0].rstrip(".,:;")  # tests/x.py::test_y: the file
            named = span.split("/")[0] in tops and "/" in span and not re.search(r"[<*{$]", span)
            if named and not (REPO / span).exists():
                bad.append(f"{path.relative_to(REPO)}: {span}")
    assert not bad, "\n".join(bad)
