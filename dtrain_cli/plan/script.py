"""The plan of your own training script: ``dtrain run train.py`` / ``-m mypkg.train``.

    dtrain plan dp=4 -- train.py --epochs 3      # what would run on every rank

dtrain does not know the script's model, so the plan keeps the layout (world size, mesh,
ranks), the batch and LR arithmetic, the checkpoint cadence and the restarts, and drops
the model estimates. The script is checked here, before anything starts or is written:
it exists, is a readable file and compiles; a module is found as ``python -m`` would find
it. Pure apart from reading the script (and importing a module's parent packages).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models.spec import ModelFacts, ModelSpec
from dtrain_cli.plan.plan import ScriptPlan


def is_script(cfg: DtrainConfig) -> bool:
    return bool(cfg.script.path or cfg.script.module)


class ScriptSpec(ModelSpec):
    """The model seam for a script: the model is the script's own, unknown to the plan."""

    kind = "script"
    config_class = dict

    @property
    def name(self) -> str:
        return "script"

    def facts(self) -> ModelFacts:
        return ModelFacts(num_params=0, unit="samples")

    def problems(self, cfg: DtrainConfig) -> list[str]:
        return []  # tp/pp: the script builds its own parallelism on the planned mesh

    def default_loss(self) -> str:
        return "script"

    def build(self, device: Any) -> Any:
        raise NotImplementedError("a script run builds its own model")


class ScriptProblem(ValueError):
    """One line: what is wrong with the script and what to do."""


def script_plan(
    cfg: DtrainConfig, workdir: Path | None = None
) -> tuple[ScriptPlan | None, list[str]]:
    """The script every rank runs, checked, and the problems found (one line each)."""
    sc = cfg.script
    if not is_script(cfg):
        if cfg.launcher.python:
            return None, [
                f"launcher.python={cfg.launcher.python}: only your own script runs under "
                "another interpreter (dtrain run ... -- train.py); dtrain's trainer runs "
                "under dtrain's"
            ]
        return None, []
    cwd = (workdir or Path.cwd()).resolve()
    if sc.path and sc.module:
        return None, [
            f"script.path={sc.path} and script.module={sc.module}: set one "
            "(a file: dtrain run train.py; a module: dtrain run -m mypkg.train)"
        ]
    try:
        file = module_file(sc.module, cwd) if sc.module else script_file(str(sc.path), cwd)
        python = interpreter(cfg.launcher.python, cwd)
    except ScriptProblem as exc:
        return None, [str(exc)]
    plan = ScriptPlan(
        path=sc.path,
        module=sc.module,
        args=list(sc.args),
        file=file,
        workdir=str(cwd),
        python=python,
    )
    return plan, []


def interpreter(python: str | None, cwd: Path) -> str | None:
    """``launcher.python`` as an absolute path (a bare name looked up on PATH), checked."""
    if not python:
        return None
    found = shutil.which(python) if os.sep not in python else str(cwd / python)
    if not found or not os.path.isfile(found):
        raise ScriptProblem(
            f"launcher.python={python}: not found; give the path of a python executable "
            "(e.g. launcher.python=/path/to/venv/bin/python)"
        )
    if not os.access(found, os.X_OK):
        raise ScriptProblem(f"launcher.python={python}: not executable; check its permissions")
    return os.path.abspath(found)  # a venv's python is a link: kept, so the venv applies


def script_file(path: str, cwd: Path) -> str:
    full = Path(os.path.abspath(cwd / path))  # __file__ as python gives it (links kept)
    if not full.exists():
        raise ScriptProblem(f"script {path}: not found (looked in {cwd}); check the path")
    if not full.is_file():
        raise ScriptProblem(f"script {path}: not a file; name the .py file to run")
    try:
        source = full.read_bytes()
    except OSError as exc:
        raise ScriptProblem(
            f"script {path}: cannot be read ({exc.strerror}); check its permissions"
        ) from None
    try:
        compile(source, str(full), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f" line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        msg = getattr(exc, "msg", None) or str(exc)
        raise ScriptProblem(
            f"script {path}:{where}: {msg}; python {path} would fail the same way"
        ) from None
    return str(full)


def module_file(name: str, cwd: Path) -> str:
    """Where ``python -m name`` (run in ``cwd``) finds the module; a package runs its
    ``__main__``. Importing the parent packages is what ``python -m`` does too."""
    saved = list(sys.path)
    sys.path.insert(0, str(cwd))
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{name}.__main__")  # python -m pkg
            if spec is None:
                raise ScriptProblem(
                    f"module {name}: a package without __main__.py; "
                    f"name the module to run (e.g. {name}.train)"
                )
    except ModuleNotFoundError as exc:  # a parent package that is not there
        raise ScriptProblem(
            f"module {name}: not found from {cwd} or PYTHONPATH ({exc}); run from the folder "
            "above the package or set PYTHONPATH"
        ) from None
    except Exception as exc:  # a parent package that fails to import
        raise ScriptProblem(
            f"module {name}: cannot be imported ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        sys.path[:] = saved
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise ScriptProblem(
            f"module {name}: not found from {cwd} or PYTHONPATH (python -m {name} would "
            "fail); run from the folder above the package or set PYTHONPATH"
        )
    try:
        compile(Path(spec.origin).read_bytes(), spec.origin, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError) as exc:
        where = f" line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        msg = getattr(exc, "msg", None) or getattr(exc, "strerror", None) or str(exc)
        raise ScriptProblem(f"module {name} ({spec.origin}):{where}: {msg}") from None
    return spec.origin


SPAWNERS = ("spawn", "start_processes")  # torch.multiprocessing's: mp.spawn(main, nprocs=N)


def _syntax_tree(file: str) -> ast.Module | None:
    """The script's syntax tree, parsed once for every check below (again once edited)."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    return _parsed(file, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _parsed(file: str, mtime_ns: int, size: int) -> ast.Module | None:
    try:
        return ast.parse(Path(file).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None


def own_spawn_line(file: str) -> tuple[int, str] | None:
    """Where the script starts its own ranks, and how: ``torch.multiprocessing.spawn`` (or
    ``start_processes``), the shape of pytorch/examples' DDP tutorial; or a
    ``multiprocessing.Process`` in a script that hands ``init_process_group`` a rank not
    read from the environment (PyTorch's "Writing Distributed Applications"). None if
    neither."""
    if (tree := _syntax_tree(file)) is None:
        return None
    modules, functions = _multiprocessing_names(tree)
    processes = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and ast.unparse(func.value) in modules:
            if func.attr in SPAWNERS:
                return node.lineno, f"mp.{func.attr}"
            if func.attr == "Process":
                processes.append(node.lineno)
        elif isinstance(func, ast.Name) and func.id in functions:
            if functions[func.id] in SPAWNERS:
                return node.lineno, f"mp.{functions[func.id]}"
            processes.append(node.lineno)
    if processes and _ranks_its_own_group(tree):
        return min(processes), "multiprocessing.Process"
    return None


def _multiprocessing_names(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """The names the script gives (torch.)multiprocessing, and the spawn or Process
    functions it imports from it (name -> what it is)."""
    mp = ("torch.multiprocessing", "multiprocessing")
    modules, functions = set(mp), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in mp}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            modules |= {a.asname or a.name for a in node.names if a.name == "multiprocessing"}
        elif isinstance(node, ast.ImportFrom) and node.module in mp:
            wanted = (*SPAWNERS, "Process") if node.module == mp[0] else ("Process",)
            functions |= {a.asname or a.name: a.name for a in node.names if a.name in wanted}
    return modules, functions


def _ranks_its_own_group(tree: ast.Module) -> bool:
    """Whether an ``init_process_group(..., rank=...)`` takes a rank not read from
    torchrun's environment (``RANK``, ``LOCAL_RANK``, ``os.environ``)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not ast.unparse(node.func).endswith(
            "init_process_group"
        ):
            continue
        for kw in node.keywords:
            if kw.arg == "rank" and not any(
                w in ast.unparse(kw.value) for w in ("RANK", "environ", "getenv")
            ):
                return True
    return False


def spawn_warning(script: ScriptPlan, world_size: int) -> str | None:
    """A script that spawns its own ranks, run on more than one: every rank spawns them
    again and their process groups collide on one address."""
    if world_size <= 1 or (found := own_spawn_line(script.file)) is None:
        return None
    line, how = found
    name = script.path or script.module
    return (
        f"script {name} line {line} starts its own processes ({how}): each of the "
        f"{world_size} ranks dtrain starts would start them again, on one rendezvous address; "
        f"run it as one process (dtrain run -- {name}), or let dtrain start the ranks: call "
        "its worker function once, with the rank from RANK (docs/own-script.md)"
    )


LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def local_rank_flag_line(file: str) -> int | None:
    """The line of an ``add_argument("--local_rank", ...)`` in a script that never names
    ``LOCAL_RANK``: the deprecated ``torch.distributed.launch`` passed that flag to each
    rank; torchrun and dtrain set ``LOCAL_RANK`` in the environment and pass no flag."""
    if (tree := _syntax_tree(file)) is None:
        return None
    line = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "LOCAL_RANK":
            return None  # read from the environment too (os.environ.get("LOCAL_RANK", ...))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.attr == "add_argument" and set(flags) & set(LOCAL_RANK_FLAGS):
                line = node.lineno if line is None else min(line, node.lineno)
    return line


def local_rank_warning(script: ScriptPlan, world_size: int) -> str | None:
    """A script that takes its rank from ``--local_rank`` alone, run on more than one rank:
    every rank keeps the flag's default (often -1: "not distributed", each rank alone)."""
    if world_size <= 1 or (line := local_rank_flag_line(script.file)) is None:
        return None
    return (
        f"script {script.path or script.module} line {line} takes --local_rank, which the "
        "deprecated torch.distributed.launch passed; torchrun and dtrain do not, so every "
        "rank keeps its default: read int(os.environ['LOCAL_RANK']) (docs/own-script.md)"
    )


def script_warnings(script: ScriptPlan, world_size: int) -> list[str]:
    """What the plan says about a script that would misbehave on ``world_size`` ranks."""
    found = (spawn_warning(script, world_size), local_rank_warning(script, world_size))
    return [w for w in found if w]
