"""Run your own training script on one rank, as ``python train.py`` would (``dtrain run``).

    dtrain run dp=2 -- train.py --epochs 3

The elastic agent sets every variable torchrun sets (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``...) and starts this module's entry on every rank:
:func:`script_main` in a worker forked from the fork server (``start_method=forkserver``,
torch already imported) or from the agent (``fork``); :func:`main` in a fresh interpreter
(``spawn``: ``python -u -c ... RUN_DIR``, what torchrun starts). Either way the script runs
as ``__main__`` with ``sys.argv`` = its own arguments, ``sys.path[0]`` = its folder (the
current directory for ``-m``) and ``__file__`` absolute, and ``DTRAIN_RUN_DIR`` /
``DTRAIN_PLAN`` point at the run (:mod:`dtrain_cli.script_env` reads them).

Every rank's stdout and stderr go to the console, as under torchrun, and to
``logs/rank_<k>.log``, so the launcher can show the failing rank's last traceback lines.
A script that saved its checkpoint on the preemption signal exits with
:data:`~dtrain_cli.runtime.preemption.EXIT_PREEMPTED` (75): the rank records
``preempted.json`` and ends cleanly, and the launcher exits 75 (SLURM then requeues).
No torch import here: a ``spawn`` worker imports only what the script imports.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import json
import os
import runpy
import sys
import threading
import time
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from dtrain_cli.runtime.preemption import EXIT_PREEMPTED, MARKER
from dtrain_cli.script_env import CONFIG_ENV, PLAN_ENV, RUN_DIR_ENV

# What torch's agent sets for each worker (already in os.environ when script_main runs)
TORCH_WORKER_KEYS = frozenset(
    {
        "RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "LOCAL_RANK",
        "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "TORCHELASTIC_ERROR_FILE",
    }
)


def script_main(run_dir: str, agent_env: dict[str, str] | None = None) -> None:
    """The agent's function entry point (fork, forkserver): torch's ``record`` around it
    writes an exception's traceback where the launcher finds it. ``agent_env``: what the
    agent's environment has that the fork server's lacks (torchrun's workers inherit it)."""
    server = sys.modules.get("dtrain_cli.runtime.server_preload")
    if server is not None:  # forked from the fork server, which ignores some signals
        server.restore_worker_signals()
    for key, value in (agent_env or {}).items():
        if key not in TORCH_WORKER_KEYS:
            os.environ[key] = value
    run_script(Path(run_dir))


def main() -> None:
    """``spawn``: a fresh interpreter, started by the agent as a subprocess."""
    try:
        run_script(Path(sys.argv[1]))
    except SystemExit:
        raise
    except BaseException as exc:  # the traceback is in the rank's log already
        _record_error(exc)
        raise SystemExit(1) from None


def run_script(run_dir: Path) -> None:
    plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    sc = plan["script"]
    rank = int(os.environ.get("RANK", "0"))
    os.environ[RUN_DIR_ENV] = str(run_dir)
    os.environ[PLAN_ENV] = str(run_dir / "plan.yaml")
    os.environ[CONFIG_ENV] = str(run_dir / "config.yaml")
    with contextlib.suppress(OSError):
        os.chdir(sc["workdir"])  # where the command ran: relative paths resolve as there
    for stream in (sys.stdout, sys.stderr):  # torchrun runs python -u
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(write_through=True)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    from dtrain_cli.runtime import script_arrival

    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    script_arrival.install(float(config.get("launcher", {}).get("rdzv_timeout_s") or 900))
    with tee_output(run_dir / "logs" / f"rank_{rank}.log"):
        try:
            run_as_main(sc)
        except SystemExit as exc:
            if exc.code == EXIT_PREEMPTED:  # the script saved its checkpoint: requeue
                record_preempted(run_dir, rank)
                return
            if exc.code not in (None, 0) and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # sys.exit("message"), as python does
                raise SystemExit(1) from None
            raise
        except BaseException as exc:
            print_script_traceback(exc)
            raise


def run_as_main(sc: dict[str, Any]) -> None:
    """What ``python FILE ARGS`` / ``python -m MODULE ARGS`` set up, then the code."""
    if sc.get("module"):
        sys.argv = [sc["file"], *sc["args"]]  # python -m puts the module's file first
        sys.path[0:1] = [os.getcwd()]
        runpy.run_module(sc["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [sc["path"], *sc["args"]]  # as typed; __file__ is absolute (python 3.9+)
        sys.path[0:1] = [os.path.dirname(os.path.realpath(sc["file"]))]  # as python sets it
        run_file(sc["file"])


def run_file(file: str) -> None:
    """``python FILE``'s ``__main__`` (runpy.run_path would put FILE in ``sys.argv[0]``)."""
    code = compile(Path(file).read_bytes(), file, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=file,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", file),
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickle, multiprocessing's spawn find the script here
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def print_script_traceback(exc: BaseException) -> None:
    """The traceback as ``python train.py`` prints it: the frames of runpy and of this
    module left out."""
    tb = exc.__traceback__
    ours = ("runpy", __name__)  # runpy may be frozen: known by its module name
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in ours:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    sys.stderr.flush()


def record_preempted(run_dir: Path, rank: int) -> None:
    info = {"preempted": True, "by": "script", "rank": rank, "step": None, "time": time.time()}
    tmp = run_dir / f".{MARKER}.{rank}.tmp"
    tmp.write_text(json.dumps(info))
    tmp.replace(run_dir / MARKER)


def _record_error(exc: BaseException) -> None:
    """torch's error file (``TORCHELASTIC_ERROR_FILE``), as ``@record`` writes it."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    with contextlib.suppress(Exception):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)


@contextlib.contextmanager
def tee_output(path: Path) -> Iterator[None]:
    """fds 1 and 2 (Python's, C extensions', forked children's) to the console they were
    on and to ``path``."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved: list[tuple[int, int]] = []
    pumps: list[threading.Thread] = []
    for fd in (1, 2):
        console = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        pump = threading.Thread(target=_pump, args=(read_end, console, log), daemon=True)
        pump.start()
        saved.append((fd, console))
        pumps.append(pump)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, console in saved:
            os.dup2(console, fd)  # the pipe's last write end closes: the pump sees EOF
        for pump in pumps:
            pump.join(timeout=2.0)  # a child of the script may still hold the pipe
        os.close(log)


def _pump(read_end: int, console: int, log: int) -> None:
    try:
        while data := os.read(read_end, 65536):
            for fd in (console, log):
                _write_all(fd, data)
    finally:
        os.close(read_end)
        os.close(console)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a closed console must not stop the log
        while data:
            data = data[os.write(fd, data) :]


if __name__ == "__main__":
    main()
