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
``logs/rank_<k>.log`` (:mod:`.tee`, which outlives a rank killed by a signal), so the
launcher can show the failing rank's last traceback lines; a fatal signal (a segmentation
fault in a C extension, an abort) prints the rank's Python stack first (faulthandler).
A script that saved its checkpoint on the preemption signal exits with
:data:`~dtrain_cli.rundir.protocol.EXIT_PREEMPTED` (75): the rank records
``preempted.json`` and ends cleanly, and the launcher exits 75 (SLURM then requeues).
No torch import here: a ``spawn`` worker imports only what the script imports.
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import importlib.machinery
import os
import runpy
import signal
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

import yaml

from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.notes import attempt_cause, write_note
from dtrain_cli.rundir.protocol import EXIT_PREEMPTED, signal_number
from dtrain_cli.runtime.diagnostics.interrupt import InterruptGuard, restore_default_signals
from dtrain_cli.runtime.diagnostics.launcher_watch import end_with_launcher
from dtrain_cli.runtime.script.fresh_state import fresh_random_state
from dtrain_cli.runtime.script.tee import drain_output, tee_output

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
    restore_default_signals()  # forked from the fork server (it ignores some) or the agent
    for key, value in (agent_env or {}).items():
        if key not in TORCH_WORKER_KEYS:
            os.environ[key] = value
    end_with_launcher()  # a SIGKILLed launcher leaves no rank running the script alone
    InterruptGuard(grace_s=2.0).install(signal.default_int_handler)
    apply_thread_settings()
    restore_default_start_method()
    hand_back_on_os_exit(_agent_return_queue(sys._getframe(1)))
    run_script(Path(run_dir))


def restore_default_start_method() -> None:
    """multiprocessing's default start method as a fresh ``python`` has it (``fork`` on
    Linux before Python 3.14): a process started from the fork server inherits
    ``forkserver``, under which a script's DataLoader workers would import the script
    again as ``__mp_main__`` (a script without ``if __name__ == "__main__"`` then fails
    where under torchrun it runs)."""
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)


def apply_thread_settings() -> None:
    """This rank's ``OMP_NUM_THREADS`` (the agent's, or yours) as torch's intra-op thread
    count. torchrun's workers are fresh interpreters that read it when torch loads; a
    worker forked with torch imported would keep the fork server's count (all cores: a
    script then runs several times slower than under torchrun)."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _agent_return_queue(frame: types.FrameType | None) -> Any:
    """The queue torch's worker wrapper (``torch.distributed.elastic.multiprocessing.api
    ._wrap``) takes this function's return value from; None if not found."""
    while frame is not None:
        if frame.f_code.co_name == "_wrap" and "ret_val_" in frame.f_locals:
            return frame.f_locals["ret_val_"]
        frame = frame.f_back
    return None


def hand_back_on_os_exit(queue: Any) -> None:
    """``os._exit(code)`` in the script, on this rank's own process: its output drained
    first (so the launcher's last line comes after it), and for code 0 the agent told that
    the rank returned (torch's function entry waits for a return value: a process that
    left with 0 and none would be waited for forever). Children the script forks keep the
    real ``os._exit``."""
    real_exit, me = os._exit, os.getpid()

    def _exit(code: int) -> None:
        if os.getpid() == me:
            drain_output()
            if code == 0 and queue is not None:
                with contextlib.suppress(Exception):
                    queue.put(None)
        real_exit(code)

    os._exit = _exit


def main() -> None:
    """``spawn``: a fresh interpreter, started by the agent as a subprocess."""
    InterruptGuard(grace_s=2.0).install(signal.default_int_handler)
    hand_back_on_os_exit(None)
    try:
        run_script(Path(sys.argv[1]))
    except SystemExit:
        raise
    except BaseException as exc:  # the traceback is in the rank's log already
        _record_error(exc)
        raise SystemExit(1) from None


def sigterm_as_preemption(name: str, on_sigterm: bool = True) -> None:
    """In a SLURM job or a pod, SIGTERM is a preemption, ``scontrol requeue`` or eviction:
    a rank whose script handles the preemption signal (``cluster.signal``) gets SIGTERM as
    that signal, and saves its checkpoint as dtrain's trainer does (it lost its work to
    SIGTERM: a new user's find). A script that handles neither, or sets its own SIGTERM
    handler, or ``cluster.checkpoint_on_sigterm=false``: SIGTERM as before. Only this
    process (not a DataLoader worker it forks) passes it on."""
    if not name or not on_sigterm or not env.in_scheduler_job():
        return
    num, owner = signal_number(name), os.getpid()
    if num == signal.SIGTERM:
        return

    def as_preemption(signum: int, frame: Any) -> None:
        if os.getpid() == owner and callable(signal.getsignal(num)):
            os.kill(owner, num)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # no handler for it: ended by SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, as_preemption)


def run_script(run_dir: Path) -> None:
    run = RunDir(run_dir)
    plan = yaml.safe_load(run.plan.read_text())
    sc = plan["script"]
    rank = int(os.environ.get("RANK", "0"))
    env.set_script_files(run_dir, run.plan, run.config)
    with contextlib.suppress(OSError):
        os.chdir(sc["workdir"])  # where the command ran: relative paths resolve as there
    for stream in (sys.stdout, sys.stderr):  # torchrun runs python -u
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(write_through=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    from dtrain_cli.runtime.parallel import group_lifetime
    from dtrain_cli.runtime.script import arrival as script_arrival

    config = yaml.safe_load(run.config.read_text()) or {}
    script_arrival.install(float(config.get("launcher", {}).get("rdzv_timeout_s") or 900))
    cluster = config.get("cluster", {})
    sigterm_as_preemption(cluster.get("signal") or "", cluster.get("checkpoint_on_sigterm", True))
    group_lifetime.install()  # no hang when DDP's reducer outlives destroy_process_group
    fresh_random_state()
    mark_start(run.rank_log(rank))
    with tee_output(run.rank_log(rank)):
        if not faulthandler.is_enabled():  # a fatal signal prints the Python stack first
            faulthandler.enable()
        say_restarted(run_dir, rank)
        try:
            run_as_main(sc)
            script_arrival.say_if_alone(rank, sc["file"])
        except SystemExit as exc:
            code = exit_status(exc)
            if code == EXIT_PREEMPTED:  # the script saved its checkpoint: requeue
                record_preempted(run_dir, rank)
                return
            if code == 0:  # sys.exit(), sys.exit(0): a clean end, as falling off the end
                script_arrival.say_if_alone(rank, sc["file"])
                return
            write_note(run_dir, rank, None, None, exitcode=code)
            raise SystemExit(code) from None
        except BaseException as exc:
            print_script_traceback(exc)
            write_note(run_dir, rank, None, exc, exitcode=1)  # as python exits
            if isinstance(exc, KeyboardInterrupt):  # forkserver's wrapper exits 0 on it
                raise SystemExit(1) from None
            raise


def mark_start(log: Path) -> None:
    """A line in the rank's log between what an earlier attempt (or the run before a
    ``dtrain resume``) wrote there and this start's output: the log is appended to."""
    with contextlib.suppress(OSError):
        if log.stat().st_size:
            attempt = env.restart_count()
            how = f"restart attempt {attempt}" if attempt else "a new start (dtrain resume)"
            with log.open("a") as f:
                f.write(f"----- dtrain: {how}, {time.strftime('%Y-%m-%d %H:%M:%S')} -----\n")


def say_restarted(run_dir: Path, rank: int) -> None:
    """Rank 0 of a restarted group says so on the console (and in its log), with what
    ended the attempt before, as dtrain's trainer does: the restart was silent."""
    attempt = env.restart_count()
    if attempt and rank == 0:
        world = int(os.environ.get("WORLD_SIZE", "0") or 0)
        most = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
        cause = attempt_cause(run_dir, attempt - 1, world)
        print(f"dtrain: restarted (attempt {attempt} of {most}) after {cause}", file=sys.stderr)


def exit_status(exc: SystemExit) -> int:
    """The process exit status python gives ``raise SystemExit(code)``: None -> 0, an int
    as it is, anything else printed to stderr -> 1 (``sys.exit("message")``)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


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
    module left out at the top, the interrupt guard's handler at the bottom, and those of
    the wrapper that stands in for ``init_process_group`` (the script called torch's)."""
    tb = exc.__traceback__
    ours = ("runpy", __name__)  # runpy may be frozen: known by its module name
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in ours:
        tb = tb.tb_next
    frames = [
        (frame, line)
        for frame, line in traceback.walk_tb(tb)
        if frame.f_globals.get("__name__") not in (InterruptGuard.__module__, ARRIVAL)
    ]
    shown = traceback.TracebackException(type(exc), exc, None)
    shown.stack = traceback.StackSummary.extract(iter(frames))
    print("".join(shown.format()), end="", file=sys.stderr)
    sys.stderr.flush()


ARRIVAL = "dtrain_cli.runtime.script.arrival"


def record_preempted(run_dir: Path, rank: int) -> None:
    info = {"preempted": True, "by": "script", "rank": rank, "step": None, "time": time.time()}
    protocol.write_preempted(RunDir(run_dir), info, writer=rank)


def _record_error(exc: BaseException) -> None:
    """torch's error file (``TORCHELASTIC_ERROR_FILE``), as ``@record`` writes it."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    with contextlib.suppress(Exception):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)


if __name__ == "__main__":
    main()
