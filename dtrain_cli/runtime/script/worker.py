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
:data:`~dtrain_cli.rundir.protocol.EXIT_PREEMPTED` (75): the rank records
``preempted.json`` and ends cleanly, and the launcher exits 75 (SLURM then requeues).
No torch import here: a ``spawn`` worker imports only what the script imports.
"""

from __future__ import annotations

import array
import builtins
import contextlib
import fcntl
import importlib.machinery
import os
import runpy
import select
import signal
import sys
import termios
import threading
import time
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from dtrain_cli.rundir import env, protocol
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.notes import write_note
from dtrain_cli.rundir.protocol import EXIT_PREEMPTED
from dtrain_cli.runtime.diagnostics.interrupt import InterruptGuard, restore_default_signals
from dtrain_cli.runtime.diagnostics.launcher_watch import end_with_launcher
from dtrain_cli.runtime.script.fresh_state import fresh_random_state

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
    first (the tee's threads die with the process), and for code 0 the agent told that
    the rank returned (torch's function entry waits for a return value: a process that
    left with 0 and none would be waited for forever). Children the script forks keep the
    real ``os._exit``."""
    real_exit, me = os._exit, os.getpid()

    def _exit(code: int) -> None:
        if os.getpid() == me:
            _drain_output()
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
    group_lifetime.install()  # no hang when DDP's reducer outlives destroy_process_group
    fresh_random_state()
    with tee_output(run.rank_log(rank)):
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
    module left out at the top, the interrupt guard's handler at the bottom."""
    tb = exc.__traceback__
    ours = ("runpy", __name__)  # runpy may be frozen: known by its module name
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in ours:
        tb = tb.tb_next
    frames = [
        (frame, line)
        for frame, line in traceback.walk_tb(tb)
        if frame.f_globals.get("__name__") != InterruptGuard.__module__
    ]
    shown = traceback.TracebackException(type(exc), exc, None)
    shown.stack = traceback.StackSummary.extract(iter(frames))
    print("".join(shown.format()), end="", file=sys.stderr)
    sys.stderr.flush()


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


PARTIAL_LINE_S = 0.25
"""How long an unfinished line (a prompt, a progress bar without ``\\r``) waits for its end
before it is forwarded as it is."""
PIPE_BUF = 4096
"""Writes up to this size reach a pipe whole (POSIX): one rank's lines never splice with
another's on a shared console."""

DRAIN_S = 30.0
"""How long a rank's end waits for its output to reach the console and its log: a loaded
machine can keep the pump from running for seconds, and what is still in the pipe when the
process exits is lost. A child of the script that still holds the pipe ends the wait as
soon as everything written so far is forwarded."""

_tee: list[tuple[int, int]] = []  # (fd, console) while the tee runs
_pumps: list[_Pump] = []


@contextlib.contextmanager
def tee_output(path: Path) -> Iterator[None]:
    """fds 1 and 2 (Python's, C extensions', forked children's) to the console they were
    on and to ``path``, a whole line at a time."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        console = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        pump = _Pump(read_end=read_end, console=console, log=log)
        pump.start()
        _tee.append((fd, console))
        _pumps.append(pump)
    try:
        yield
    finally:
        _drain_output()
        os.close(log)


def _drain_output() -> None:
    """Put fds 1 and 2 back on the console and wait until the pumps have forwarded what is
    left: they see the pipe's end, or (a child of the script still holds the pipe) nothing
    is left unread; at most :data:`DRAIN_S`."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    while _tee:
        fd, console = _tee.pop()
        os.dup2(console, fd)  # the pipe's last write end closes: the pump sees EOF
    deadline = time.monotonic() + DRAIN_S
    while _pumps:
        pump = _pumps[-1]
        pump.join(timeout=0.01)
        if pump.forwarded_all() or time.monotonic() > deadline:
            _pumps.pop()


class _Pump(threading.Thread):
    """One pipe to the console and the log, a whole line at a time."""

    def __init__(self, *, read_end: int, console: int, log: int) -> None:
        super().__init__(daemon=True, name=f"dtrain-tee-{read_end}")
        self.read_end, self.console, self.log = read_end, console, log
        self.idle = threading.Event()  # waiting for data, nothing held back

    def forwarded_all(self) -> bool:
        """Ended, or nothing unread in the pipe while nothing is held back (checked in this
        order: a pump that was forwarding when the pipe was found empty has set ``idle``
        only after it wrote everything out)."""
        if not self.is_alive():
            return True
        try:
            unread = array.array("i", [0])
            fcntl.ioctl(self.read_end, termios.FIONREAD, unread)
        except OSError:  # closed: the pump saw the end
            return not self.is_alive()
        return unread[0] == 0 and self.idle.is_set()

    def run(self) -> None:
        pending = b""
        try:
            while True:
                if not pending:
                    self.idle.set()
                wait = PARTIAL_LINE_S if pending else None
                ready = select.select([self.read_end], [], [], wait)[0]
                self.idle.clear()
                if not ready:
                    _forward(pending, self.console, self.log)  # an unfinished line waited
                    pending = b""
                    continue
                data = os.read(self.read_end, 65536)
                if not data:
                    break
                pending += data
                cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
                if cut:
                    _forward(pending[:cut], self.console, self.log)
                    pending = pending[cut:]
        finally:
            _forward(pending, self.console, self.log)
            os.close(self.read_end)
            os.close(self.console)


def _forward(data: bytes, console: int, log: int) -> None:
    """Whole lines, each write at most one pipe buffer (a longer line goes alone)."""
    while data:
        cut = data.rfind(b"\n", 0, PIPE_BUF) + 1 if len(data) > PIPE_BUF else len(data)
        chunk, data = data[: cut or len(data)], data[cut or len(data) :]
        for fd in (console, log):
            _write_all(fd, chunk)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a closed console must not stop the log
        while data:
            data = data[os.write(fd, data) :]


if __name__ == "__main__":
    main()
