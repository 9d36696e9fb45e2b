"""Imported only by the workers' fork server, as its preload module.

It imports the worker entry point (torch and the runtime) at once, then waits for the
launcher to name the modules the run needs before the first step
(:func:`dtrain_cli.launch.worker_server.announce`: one list or more, the last marked),
imports them as each list comes, and returns after the last; the server
then serves the agent's requests for workers, with what it imported frozen out of the
garbage collector's reach (:mod:`dtrain_cli.import_gc`). Everything here is a speed-up: a module
that fails to import is left to the worker, and a launcher that exits stops the wait.

The server also ignores the signals a scheduler sends to every process of a job step
(SLURM's preemption ``USR1``, ``TERM``...): the agent learns its workers' exit codes
through the server, so the server must outlive them; the agent handles those signals.
Workers forked from it set the default dispositions first thing
(:func:`dtrain_cli.runtime.diagnostics.interrupt.restore_default_signals`), before
installing their own handlers.
"""

from __future__ import annotations

import importlib
import os
import signal

from dtrain_cli.rundir import env

if env.preload_pending():  # the fork server: a Ctrl-C during the imports below is the
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # launcher's; prepare_server's handler next

from dtrain_cli.import_gc import imports_without_collection
from dtrain_cli.launch.preload import WORKER_FIRST  # after the shield
from dtrain_cli.launch.preload_lists import import_announced_modules
from dtrain_cli.rundir.protocol import STEP_SIGNALS

_SERVER_PID = os.getpid()


def _ignored_by_the_server(signum: int, frame: object) -> None:
    """The server ignores the signal; a worker forked from it that gets the signal before
    it set its own handlers (the agent stopping a group that just started, Ctrl-C) acts as
    the default disposition would: a worker must never ignore it."""
    if os.getpid() == _SERVER_PID:
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def shield_server_from_step_signals() -> None:
    """The launcher started the server with these signals ignored (and so the resource
    tracker, through exec); here the server ignores them by a handler that its workers
    do not inherit as "ignored". A terminal's Ctrl-C reaches the server too, perhaps while
    it imports torch: the launcher stops (and it stops the server); no KeyboardInterrupt
    traceback from here."""
    for sig in (*STEP_SIGNALS, signal.SIGINT):
        signal.signal(sig, _ignored_by_the_server)


def prepare_server() -> list[str]:
    """Shield the server, import what the launcher named (the worker entry point at once,
    then each list as it comes); returns the names imported. A warm pool's server
    (:mod:`.pool_server`) runs this too, on modules it mostly has already."""
    global _SERVER_PID
    _SERVER_PID = os.getpid()
    shield_server_from_step_signals()
    file, launcher, first = env.take_preload(WORKER_FIRST)
    # every worker forked from here keeps what these make to its end: frozen, a worker's
    # full collections never walk it (~300k objects, 0.2-0.3 s a pass here)
    with imports_without_collection():
        # while the launcher composes: the worker entry point (dtrain's, or your script's)
        for name in first:
            importlib.import_module(name)
        return [*first, *import_announced_modules(file, launcher)]


if env.preload_pending():  # imported as the fork server's preload module
    prepare_server()
