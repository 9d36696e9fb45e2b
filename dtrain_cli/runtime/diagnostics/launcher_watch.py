"""A worker ends with the launcher that started it.

    kill -9 <launcher>     # its workers end within a second, wherever they were forked

torch's agent ends its workers when the launcher stops (Ctrl-C, SIGTERM, a failure), but a
launcher killed by SIGKILL (the OOM killer, ``kill -9``) runs no clean-up: the workers,
forked by multiprocessing's fork server, keep the server alive (each holds its "alive"
pipe) and trained on alone, a lone rank without a peer to miss, writing checkpoints into
a run dir that a new ``dtrain resume`` then shared. Each worker watches the launcher's pid
(``DTRAIN_LAUNCHER_PID``, set by the launcher) with a pidfd and SIGKILLs itself when it
ends, as the warm pool does for the servers it forks. Torch-free.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from dtrain_cli.rundir import env

POLL_S = 1.0
"""Where no pidfd can be opened: how often the launcher's pid is checked."""


def end_with_launcher() -> None:
    """Start the watch (a daemon thread); nothing outside a launch's workers."""
    pid = env.launcher_pid()
    if pid is None or pid == os.getpid() or not _is_dtrain(pid):
        return  # not this machine's launcher as seen from here (another PID namespace)
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:  # gone since
        _end()
        return
    except (OSError, AttributeError):  # no pidfd here (an old kernel): poll
        fd = None
    threading.Thread(
        target=_watch, args=(pid, fd), name="dtrain-launcher-watch", daemon=True
    ).start()


def _watch(pid: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has ended
    else:
        while _alive(pid):
            time.sleep(POLL_S)
    _end()


def _is_dtrain(pid: int) -> bool:
    """The pid is a dtrain command here (``launcher.python`` may run a rank in a container
    with PID namespace of its own, where the number names another process, or none)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"dtrain" in f.read()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _end() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
