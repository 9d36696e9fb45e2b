"""The plan of your own training script: ``dtrain run train.py`` / ``-m mypkg.train``.

    dtrain plan dp=4 -- train.py --epochs 3      # what would run on every rank

dtrain does not know the script's model, so the plan keeps the layout (world size, mesh,
ranks), the batch and LR arithmetic, the checkpoint cadence and the restarts, and drops
the model estimates. The script is checked here, before anything starts or is written:
it exists, is a readable file and compiles; a module is found as ``python -m`` would find
it. Pure apart from reading the script (and importing a module's parent packages).
"""

from __future__ import annotations

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


def preemption_warning(script: ScriptPlan, signal_name: str, lead_s: int) -> str | None:
    """A SLURM job's script that sets no signal handler: SLURM's ``cluster.signal`` before
    the time limit (and a requeue's SIGTERM, passed on as it) end it without a checkpoint,
    as 'killed by SIGUSR1' (a new user's find). Said by ``dtrain sbatch`` before the queue."""
    import ast

    try:
        tree = ast.parse(Path(script.file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):  # signal.signal(SIG..., handler), or signal(...) imported
        call = isinstance(node, ast.Call) and len(node.args) >= 2
        if call and ast.unparse(node.func).split(".")[-1] == "signal":
            return None
    sig = signal_name.upper().removeprefix("SIG")
    return (
        f"script {script.path or script.module} sets no signal handler: SLURM's SIG{sig} "
        f"{lead_s} s before the time limit (cluster.signal, signal_lead_s) and a requeue's "
        f"SIGTERM end it without a checkpoint; catch SIG{sig}, save and exit 75 "
        "(docs/own-script.md#preemption, examples/train.py)"
    )
