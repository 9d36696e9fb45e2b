"""The house's rules, checked on the code as it is (docs/ARCHITECTURE.md is the map):

- no import circle between modules of dtrain_cli at import time (imports under
  ``TYPE_CHECKING`` are type-only and do not count);
- nothing below the runtime imports it, not even inside a function: launch/, cli/,
  report/, checkpoint/, rundir/, script_env, config/, plan/, corpus/, the registries;
- the runtime never imports cli/ or launch/; rundir/ and mesh/ import nothing of dtrain;
- nothing outside the registries compares a strategy or a sync mode name;
- config/ and plan/ dataclasses are keyword-only; no function over 80 lines, no module
  over 400;
- the run directory's documented listing (docs/run-directory.md) is the code's
  (:data:`dtrain_cli.rundir.ENTRIES`), and a real run dir holds nothing else.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtrain_cli.rundir import ENTRIES
from tests.conftest import REPO

PACKAGE = REPO / "dtrain_cli"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test)


def imports(path: Path, *, import_time_only: bool) -> Iterator[tuple[str, int]]:
    """(imported dtrain_cli module, line) of every import in the file, resolved to a
    module of the package; type-only imports left out; function bodies too when
    ``import_time_only``."""

    def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[str, int]]:
        if _type_checking_block(node):
            return
        if isinstance(node, ast.Import | ast.ImportFrom) and not (import_time_only and in_function):
            yield from _targets(node)
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            yield from visit(child, nested)

    yield from visit(ast.parse(path.read_text()), False)


def _targets(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, int]]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.module:
        names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
    else:
        names = []
    for name in names:
        while name and name not in MODULES:  # `from pkg import name`: the module it is in
            name = name.rpartition(".")[0]
        if name.startswith("dtrain_cli"):
            yield name, node.lineno


def test_no_import_circles_at_import_time():
    graph = {
        mod: {t for t, _ in imports(path, import_time_only=True)} - {mod}
        for mod, path in MODULES.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def walk(mod: str) -> None:
        state[mod] = 1
        stack.append(mod)
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                circles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                walk(dep)
        stack.pop()
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            walk(mod)
    assert circles == [], "\n".join(" -> ".join(c) for c in circles)


BELOW_RUNTIME = (
    "dtrain_cli.cli",
    "dtrain_cli.launch",
    "dtrain_cli.report",
    "dtrain_cli.checkpoint",
    "dtrain_cli.rundir",
    "dtrain_cli.script_env",
    "dtrain_cli.config",
    "dtrain_cli.plan",
    "dtrain_cli.corpus",
    "dtrain_cli.strategies",
    "dtrain_cli.sync_modes",
    "dtrain_cli.mesh",
    "dtrain_cli.models",
)
GROUND = (  # docs/ARCHITECTURE.md: "nothing of dtrain"
    "dtrain_cli.rundir",
    "dtrain_cli.mesh",
    "dtrain_cli.errors",
    "dtrain_cli.targets",
    "dtrain_cli.source_stats",
    "dtrain_cli.kept",
    "dtrain_cli.signal_wakeup",
    "dtrain_cli.import_gc",
    "dtrain_cli.hub",
    "dtrain_cli.registry",
)
RULES = [
    # (modules under, may not import modules under, why)
    (BELOW_RUNTIME, ("dtrain_cli.runtime",), "the runtime is the top of the worker side"),
    (("dtrain_cli.runtime",), ("dtrain_cli.cli", "dtrain_cli.launch"), "workers never launch"),
    (GROUND, ("dtrain_cli.",), "ground"),
]


def _under(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p if p.endswith(".") else p + ".") for p in prefixes)


@pytest.mark.parametrize(("sources", "forbidden", "why"), RULES, ids=[r[2] for r in RULES])
def test_no_import_runs_against_the_layers(sources, forbidden, why):
    bad = []
    for mod, path in MODULES.items():
        if not _under(mod, sources):
            continue
        for target, line in imports(path, import_time_only=False):
            own = target.split(".")[:2] == mod.split(".")[:2]  # inside its own package
            if _under(target, forbidden) and not own:
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert bad == [], f"{why}:\n" + "\n".join(bad)


NAMES = {"ddp", "zero1", "fsdp", "hsdp", "sync", "local_sgd", "param_server", "diloco"}


def _compares_a_name(node: ast.Compare) -> bool:
    sides = [node.left, *node.comparators]
    attr = any(isinstance(s, ast.Attribute) and s.attr in ("strategy", "mode") for s in sides)
    consts = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)]
    return attr and any(c.value in NAMES for c in consts)


def test_only_the_registries_compare_strategy_and_sync_mode_names():
    bad = []
    for mod, path in MODULES.items():
        if _under(mod, ("dtrain_cli.strategies", "dtrain_cli.sync_modes")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and _compares_a_name(node):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert bad == []


def test_config_and_plan_dataclasses_are_keyword_only():
    bad = []
    for mod, path in MODULES.items():
        if not _under(mod, ("dtrain_cli.config", "dtrain_cli.plan")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for d in node.decorator_list:
                    text = ast.unparse(d)
                    if text.startswith("dataclass") and "kw_only=True" not in text:
                        bad.append(f"{path.relative_to(REPO)}: {node.name}")
    assert bad == []


def test_functions_and_modules_stay_readable():
    long_functions, long_modules = [], []
    for path in MODULES.values():
        text = path.read_text()
        if len(text.splitlines()) > 400:
            long_modules.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long_functions.append(f"{path.relative_to(REPO)}:{node.name}: {n} lines")
    assert long_functions == [] and long_modules == []


def documented_paths() -> list[str]:
    """The path each row of docs/run-directory.md's table starts with."""
    table = (REPO / "docs" / "run-directory.md").read_text().split("## Every file")[1]
    return re.findall(r"^\| `([^`]+)`", table, re.M)


def test_every_run_dir_entry_is_documented_and_every_documented_one_exists():
    rows = documented_paths()
    covered = {key for key in ENTRIES for row in rows if entry_of(row) == key}
    assert set(ENTRIES) - covered == set(), "in the code, not in docs/run-directory.md"
    assert [row for row in rows if entry_of(row) is None] == [], "documented only"


def entry_of(text: str) -> str | None:
    """The ``ENTRIES`` key a path of a run dir (``logs/rank_0.log``) falls under (None:
    none)."""
    for key in sorted(ENTRIES, key=len, reverse=True):  # the most specific first
        pattern = re.escape(key).replace(re.escape("<k>"), r"(\d+|<k>)")
        if re.fullmatch(pattern, text) or (key.endswith("/") and text.startswith(key)):
            return key
    return None
