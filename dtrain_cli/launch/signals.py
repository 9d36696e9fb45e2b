"""The launcher's side of preemption: pass the preemption signal on to this node's workers.

    kill -USR1 <dtrain launch pid>      # workers checkpoint at the next logging step

The elastic agent runs in the ``dtrain`` process and starts the workers (as its children,
or as children of its fork server).
SLURM's ``--signal=B:USR1@N`` reaches the batch shell, which passes it to ``srun``, which
passes it to each node's agent (this process); by default USR1 would kill the agent and
orphan the workers. Here the agent keeps running and forwards the signal to its children,
whose :mod:`dtrain_cli.runtime.components.preemption` watcher sets the flag the trainer acts on.
A worker that got the signal directly too (SLURM signals every process of a step) just
sets its flag twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from dtrain_cli.launch.preload import SCRIPT_MODULE
from dtrain_cli.rundir.protocol import TEE_PROCESS_NAME, signal_number

SCRIPT_WORKER = SCRIPT_MODULE.encode()
"""In the command line of a ``dtrain run`` worker started with ``start_method=spawn``."""


def _children(parent: int) -> list[tuple[int, bytes]]:
    """(pid, cmdline) of the direct children of ``parent``, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                out.append((int(stat.parent.name), (stat.parent / "cmdline").read_bytes()))
        except OSError:
            continue
    return out


def child_pids(parent: int | None = None) -> list[int]:
    """The workers of the agent ``parent`` (default: this process), from /proc: its children
    that run its own command line (forked from it) or a script's worker (``spawn``), and the
    children of its fork server (:mod:`.worker_server`), which run the server's. Not
    helpers such as the resource tracker, a compiler, or the fork server itself."""
    parent = os.getpid() if parent is None else parent
    try:
        own = Path(f"/proc/{parent}/cmdline").read_bytes()
    except OSError:
        return []
    out = []
    for pid, cmdline in _children(parent):
        if cmdline == own or SCRIPT_WORKER in cmdline:  # forked, or your script's python -u
            out.append(pid)
        elif b"multiprocessing.forkserver" in cmdline:
            out.extend(p for p, c in _children(pid) if c == cmdline)
    if parent == os.getpid():
        out.extend(_pool_server_children())
    return out


def _pool_server_children() -> list[int]:
    """The workers forked from the warm pool's server this launch was given (not a child
    of this process: of the pool's)."""
    from dtrain_cli.launch.worker_server import pool_server_pid

    server = pool_server_pid()
    if server is None:
        return []
    try:
        own = Path(f"/proc/{server}/cmdline").read_bytes()
    except OSError:
        return []
    return [p for p, c in _children(server) if c == own]


def launch_descendants() -> list[tuple[int, bytes]]:
    """This launcher's descendants, and those of the warm pool's server it was given."""
    from dtrain_cli.launch.worker_server import pool_server_pid

    out = descendants(os.getpid())
    if (server := pool_server_pid()) is not None:
        out += descendants(server)
    return out


@contextlib.contextmanager
def forward_signal(name: str | None) -> Iterator[list[int]]:
    """While the agent runs: on signal ``name``, send it to every child process.
    Yields the list of signals received (for the launcher's report)."""
    received: list[int] = []
    if not name:
        yield received
        return
    num = signal_number(name)
    owner = os.getpid()

    def forward(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:  # a forked worker before it installed its own watcher
            return
        received.append(signum)
        for pid in child_pids(owner):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    previous = signal.signal(num, forward)
    try:
        yield received
    finally:
        signal.signal(num, previous)


@contextlib.contextmanager
def pool_follows_job_control() -> Iterator[None]:
    """While the agent runs: Ctrl-Z (SIGTSTP) and ``fg``/``bg`` (SIGCONT) reach the workers
    of a warm pool too. The terminal stops and continues its foreground process group: the
    launcher and, without a pool, its fork server and workers. A pool's server and workers
    run in a process group of the pool's session, so the launcher passes it on: on SIGTSTP
    it stops that group and then itself (SIGSTOP both); on SIGCONT it
    continues the group. A pause longer than the process group's timeout (the watchdog's
    + 15 s) ends a collective in flight, with or without a pool."""
    from dtrain_cli.launch.worker_server import pool_server_pid

    owner = os.getpid()

    def signal_pool(signum: int) -> None:
        if os.getpid() == owner and (server := pool_server_pid()) is not None:
            with contextlib.suppress(OSError):
                os.killpg(server, signum)

    def on_stop(signum: int, frame: FrameType | None) -> None:
        signal_pool(signal.SIGSTOP)
        # SIGSTOP, not SIGTSTP's default: the kernel discards a SIGTSTP to an orphaned
        # process group (a launcher started by a daemon), which would leave the workers
        # stopped under a running launcher
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped here until SIGCONT

    def on_continue(signum: int, frame: FrameType | None) -> None:
        signal_pool(signal.SIGCONT)

    previous = signal.signal(signal.SIGTSTP, on_stop), signal.signal(signal.SIGCONT, on_continue)
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, previous[0])
        signal.signal(signal.SIGCONT, previous[1])


_interrupted = False


def watch_interrupt() -> None:
    """Launcher start: remember a Ctrl-C (and raise KeyboardInterrupt as usual). Some
    libraries' imports swallow the KeyboardInterrupt; :func:`interrupted` still knows,
    so the launcher stops before it starts the workers."""

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        global _interrupted
        _interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)


def interrupted() -> bool:
    return _interrupted


KEPT_HELPERS = (b"multiprocessing.forkserver", b"resource_tracker")


@contextlib.contextmanager
def no_orphans(enabled: bool = True) -> Iterator[None]:
    """While the agent runs your own script: the launcher is a child subreaper (Linux), so
    processes the script started and left behind (a helper it never stopped, or every
    child when its rank was stopped by Ctrl-C or a failing rank) become the launcher's;
    when the run ends, however it ends, they are killed, so none outlives ``dtrain run``.
    Under a warm pool's server (a subreaper too) they are in that server's tree, and end
    the same way. The fork server and the resource tracker end as they always do."""
    if not enabled or not _set_child_subreaper():
        yield
        return
    try:
        yield
    finally:
        from dtrain_cli.launch.worker_server import pool_server_pid

        trees = [os.getpid(), *([server] if (server := pool_server_pid()) else [])]
        for parent in trees:  # a warm pool's server: its tree
            kill_descendants(parent, but=TEE_PROCESS_NAME)
        # the ranks' tees end once every writer of their pipes is gone: their last lines
        # reach the logs before the launcher reads them for its report
        deadline = time.monotonic() + TEE_WAIT_S
        while time.monotonic() < deadline and any(_tees(parent) for parent in trees):
            time.sleep(0.01)
        for parent in trees:
            kill_descendants(parent)


def _set_child_subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def descendants(parent: int) -> list[tuple[int, bytes]]:
    out, todo = [], [parent]
    while todo:
        for pid, cmdline in _children(todo.pop()):
            out.append((pid, cmdline))
            todo.append(pid)
    return out


TEE_WAIT_S = 2.0


def _comm(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/comm").read_bytes().strip()
    except OSError:
        return b""


def _tees(parent: int) -> list[int]:
    return [pid for pid, _ in descendants(parent) if _comm(pid) == TEE_PROCESS_NAME]


def kill_descendants(parent: int | None = None, but: bytes | None = None) -> list[int]:
    """SIGKILL every descendant of ``parent`` (default: this process) but the helpers that
    end by themselves (and those named ``but``); reap those that were ours. Returns the
    pids killed."""
    me = os.getpid() if parent is None else parent
    killed = []
    for pid, cmdline in descendants(me):
        if any(h in cmdline for h in KEPT_HELPERS) or (but and _comm(pid) == but):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    for pid in killed:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)  # an orphan reparented to us: no zombie left
    return killed
