"""The fork server a warm pool forks for one launch (:mod:`.pool_server`): in the forked
child, take the launch's process as a fresh server would have it, then serve.

It takes the launcher's standard streams, environment, working directory, ``sys.path``,
umask, CPU affinity and resource limits (the launcher's cgroup, nice value, interpreter
flags and import-time variables are in the pool's key: a pool started elsewhere is not
used), reseeds numpy's global generator (seeded once, when the pool imported it; Python's
``random`` reseeds itself after a fork), leads a process group of its own (the pool ends
it when the launcher is gone), becomes a child subreaper (what the workers leave running
stays in its tree, where ``dtrain run`` ends it: :func:`.signals.no_orphans`), imports
what the launcher announces (:func:`.server_preload.prepare_server`) and runs
:func:`multiprocessing.forkserver.main` on the listener and "alive" pipe the launcher
handed over.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import traceback

from dtrain_cli.launch import preload_lists, server_preload


def become_server(message: dict, fds: list[int], learned_w: int) -> None:
    """In the pool's forked child: become the launch's fork server; exits, never returns."""
    code = 0
    try:
        listener_fd, alive_r, *streams = fds
        _take_streams(streams, unbuffered=bool(message["env"].get("PYTHONUNBUFFERED")))
        os.environ.clear()
        os.environ.update(message["env"])
        with contextlib.suppress(OSError):
            os.chdir(message["cwd"])
        os.umask(int(message["umask"]))
        sys.path[:] = message["sys_path"]
        _take_settings(message.get("settings", {}))  # warm_pool.process_settings()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # the pool's own: not its workers'
        os.setpgid(0, 0)  # its own group: the pool ends it when the launcher is gone
        _keep_orphans()
        preload_lists.served_by_pool(os.getppid())
        imported = server_preload.prepare_server()
        with contextlib.suppress(OSError):
            os.write(learned_w, json.dumps(imported).encode())
        os.close(learned_w)
        from multiprocessing import forkserver

        forkserver.main(listener_fd, alive_r, [])
    except SystemExit:
        pass
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _take_streams(streams: list[int], unbuffered: bool) -> None:
    """fd 0-2 become the launcher's; Python's stdout is line-buffered on a terminal (as a
    fresh interpreter's would be; the pool's was made over its log file)."""
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    for fd in set(streams) - {0, 1, 2}:
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            tty = os.isatty(stream.fileno())
            stream.reconfigure(line_buffering=tty or stream is sys.stderr, write_through=unbuffered)


def _take_settings(settings: dict) -> None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        os.sched_setaffinity(0, settings["affinity"])
    for name, (soft, hard) in settings.get("rlimits", {}).items():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            resource.setrlimit(getattr(resource, name), (soft, hard))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()


def _keep_orphans() -> None:
    """What the workers leave running when they end (a helper your script never stopped)
    is reparented to this server, not to init: the launcher finds it among the server's
    descendants and ends it (:func:`dtrain_cli.launch.signals.no_orphans`). The server
    reaps such a process when it ends, without multiprocessing's warning about it."""
    import ctypes
    import warnings

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
