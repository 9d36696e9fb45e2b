"""The fork server the workers start from (``launcher.start_method=forkserver``, default).

torch's elastic agent starts workers through multiprocessing's fork server when asked to.
The launch commands start that server as their first act, before the config is composed
or torch is imported here, so the server imports torch and the runtime on a second core
while this process composes, plans and imports torch for the agent: the workers are forked
from it with everything loaded, and the first step comes sooner than with ``fork`` from
the agent (which must import everything itself first) or ``torchrun`` (every worker imports
anew). Forking from the server is also safe where forking the agent is not: the agent runs
the rendezvous store's threads by then.

Which modules a worker needs before its first step beyond torch and the runtime depends on
the plan (``torch._dynamo`` for DDP, DCP to resume, pipelining...), and the plan does not
exist when the server starts: the server's preload module,
:mod:`dtrain_cli.launch.server_preload`, imports the worker entry point and then waits
for the lists :func:`announce` writes: a first one as soon as the config is composed (what
the layout alone says, so the server imports while the plan builds a model on the meta
device), the last once the plan and the run dir exist.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from multiprocessing import forkserver

from dtrain_cli.launch import warm_pool
from dtrain_cli.launch.preload import WORKER_FIRST
from dtrain_cli.launch.preload_lists import write_list
from dtrain_cli.rundir import env
from dtrain_cli.rundir.protocol import STEP_SIGNALS

BASE_PRELOAD = ["dtrain_cli.launch.server_preload"]  # it imports the worker, then waits

_lists: str | None = None  # where the server waits for the lists: <_lists>.0, <_lists>.1...
_announced = 0  # lists written so far
_last_sent = False  # the list marked last is written: the server waits for no more
_running = False
_pool: warm_pool.PoolRequest | None = None  # asked for, not yet taken
_pool_server: warm_pool.PoolServer | None = None  # the pool's server our workers come from
_env_at_start: dict[str, str] = {}  # the server's (and so its workers') environment


def start(overrides: list[str] | None = None, first: tuple[str, ...] = WORKER_FIRST) -> None:
    """Start the server now unless the overrides ask for another start method (a recipe that
    does can still say so: :func:`stop` then ends the server, unused). ``first``: what it
    imports at once (dtrain's worker; ``dtrain run``: torch for your script). The workers
    come from the warm pool's server when there is a pool (:mod:`.warm_pool`): asked for
    here, in a thread, and taken with the last list."""
    global _lists, _running, _announced, _last_sent, _pool
    if _running:
        return
    for item in overrides or []:
        key, _, value = item.lstrip("+").partition("=")
        if key == "launcher.start_method" and value != "forkserver":
            return
    _env_at_start.clear()
    _env_at_start.update(os.environ)
    fd, path = tempfile.mkstemp(prefix="dtrain-preload-", suffix=".json")
    os.close(fd)
    os.unlink(path)  # the server waits for this path to appear
    _lists, _announced, _last_sent = path, 0, False
    _running = True
    atexit.register(stop)  # an error exit before the workers start leaves no server behind
    if warm_pool.wanted():
        with _preload_env(first), contextlib.suppress(OSError):
            _pool = warm_pool.PoolRequest(environ=dict(os.environ), first=first)
            return
    _start_own_server(first)


@contextlib.contextmanager
def _preload_env(first: tuple[str, ...]) -> Iterator[None]:
    """The hand-off in the environment the server starts with; the signals a scheduler
    sends to every process of a job step ignored (SLURM's USR1...), for the server and
    multiprocessing's resource tracker (started with it; an ignored signal stays ignored
    across exec). The agent and the workers need neither."""
    assert _lists is not None
    env.set_preload(_lists, os.getpid(), first)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STEP_SIGNALS}
    try:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        yield
    finally:
        env.clear_preload()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_own_server(first: tuple[str, ...]) -> None:
    with _preload_env(first):
        multiprocessing.get_context("forkserver").set_forkserver_preload(BASE_PRELOAD)
        forkserver.ensure_running()


def _take_pool_server() -> None:
    """Before the agent starts workers: the pool's server, if the pool gave one, becomes
    multiprocessing's fork server; if not, this launch starts its own (as without a pool)."""
    global _pool, _pool_server
    if _pool is None:
        return
    request, _pool = _pool, None
    served = request.result()
    if served is None:
        _start_own_server(request.first)
        return
    if request.started is not None:
        idle = env.warm_pool_idle_s() / 60
        print(
            f"started a warm worker pool (pid {request.started}): later launches here start "
            f"their workers sooner; it ends after {idle:g} idle minutes or with `dtrain pool "
            "stop` (DTRAIN_WARM_POOL=0: no pool)",
            file=sys.stderr,
        )
    _pool_server = served
    server = forkserver._forkserver  # multiprocessing's own, told of a server it did not start
    server._forkserver_address = served.address
    server._forkserver_alive_fd = served.alive_w
    server._forkserver_pid = None  # not our child: multiprocessing must not wait for it
    from multiprocessing import resource_tracker

    server.ensure_running = resource_tracker.ensure_running  # the server runs; the tracker


def pool_server_pid() -> int | None:
    """The warm pool's server this launch's workers are forked from (not our child)."""
    return _pool_server.pid if _pool_server is not None else None


def env_changes() -> dict[str, str]:
    """Variables this process set or changed since it started the server (the agent's own,
    such as ``TORCHELASTIC_SIGNALS_TO_HANDLE``): a worker forked from the server does not
    see them unless it is given them. Empty when no server runs."""
    if not _running:
        return {}
    return {k: v for k, v in os.environ.items() if _env_at_start.get(k) != v}


def announce(modules: list[str], last: bool = True) -> None:
    """Tell the server what else to import before it forks workers (each list written
    atomically, in order); after the ``last`` one it stops waiting and serves."""
    global _announced, _last_sent
    if _lists is None or _last_sent:
        return
    write_list(f"{_lists}.{_announced}", modules, last)
    _announced += 1
    _last_sent = last
    if last:
        _take_pool_server()


def stop() -> None:
    """End the server this process started: unused (another start method), or at the end
    of the run, so that no helper process outlives the launcher."""
    global _running
    if not _running:
        return
    _running = False
    _stop_pool_server()
    _stop_server()
    _remove_unread_lists()


def _stop_pool_server() -> None:
    """A request not taken is cancelled; a server the pool forked for us is ended (it ends
    by itself once the "alive" pipe closes, unless it is still importing), and
    multiprocessing forgets it. The pool itself stays, for the next launch."""
    global _pool, _pool_server
    if _pool is not None:
        _pool.cancel()
        _pool = None
    if _pool_server is None:
        return
    served, _pool_server = _pool_server, None
    with contextlib.suppress(OSError):
        os.close(served.alive_w)
    with contextlib.suppress(OSError):
        os.kill(served.pid, signal.SIGKILL)
    server = forkserver._forkserver
    server.__dict__.pop("ensure_running", None)
    server._forkserver_address = server._forkserver_alive_fd = None


def _remove_unread_lists() -> None:
    """The lists the server had not read (and removed) when it stopped: nothing is left."""
    global _lists
    if _lists is not None:
        for part in range(_announced + 1):
            for path in (f"{_lists}.{part}", f"{_lists}.{part}.tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    _lists = None


def _stop_server() -> None:
    server = forkserver._forkserver  # no public API to stop it (3.11): its private parts
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)  # it ignores TERM, and may be importing torch
    stop_server = getattr(server, "_stop", None)
    if stop_server is not None:
        stop_server()
    # the resource tracker started with the server ends when its pipe closes: close it
    # and wait (it cleans up what workers leaked), so it does not outlive the launcher
    from multiprocessing import resource_tracker

    stop_tracker = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop_tracker is not None:
        with contextlib.suppress(Exception):
            stop_tracker()
