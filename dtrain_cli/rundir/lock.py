"""One launcher per run directory at a time (this machine's): ``launcher.lock``.

    dtrain resume runs/busy     # error: runs/busy: in use by a running dtrain (pid 4242 ...)

A ``dtrain resume`` of a run still training started a second group in the same run dir:
each pruned the other's checkpoint in progress, and the first one died. The launcher of a
single-node run (``launch``, ``run``, ``resume``) holds an exclusive ``flock`` on the run
dir's ``launcher.lock`` for as long as it lives (the kernel releases it when the process
ends, however it ends); the file names the holder for the next one's message. Multi-node
runs, whose nodes share the directory over a network file system, take none. Torch-free.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path

from dtrain_cli.rundir.layout import RunDir

_HELD: list[int] = []
"""The lock files this process holds: open until it ends."""


class RunInUse(RuntimeError):
    """Another process holds the run dir's lock (the message says who), or the run dir
    cannot be written at all (:class:`Unwritable`)."""

    held = True
    """Another launcher holds it: a restart may find it free."""


class Unwritable(RunInUse):
    held = False


SCHEDULER_WAIT_S = 120.0
"""In a SLURM job or a pod, how long a start waits for the lock: a requeued job's node may
find its run dir on a network file system still locked by the lease of the node that
died (NFSv4: about 90 s), not by a launcher that runs."""


def hold(run_dir: Path, wait_s: float = 0.0) -> None:
    """Take the run dir's lock for the life of this process (again: nothing more), trying
    for up to ``wait_s`` seconds."""
    path = RunDir(run_dir).launcher_lock
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:  # a read-only mount, a full disk: nothing can be written there
        raise Unwritable(
            f"{run_dir}: cannot write in it ({exc.strerror or exc}); a run dir must be "
            "writable (its checkpoints, logs and metrics go there)"
        ) from None
    if any(os.path.sameopenfile(fd, held) for held in _HELD):
        os.close(fd)
        return
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:  # held; any other error: a file system without flock
            if time.monotonic() < deadline:
                if not said:  # the job's log says why its start waits
                    print(
                        f"{run_dir}: waiting up to {wait_s:.0f} s for its lock, held "
                        f"({_holder(fd)})",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
                time.sleep(1.0)
                continue
            holder = _holder(fd)
            os.close(fd)
            raise RunInUse(
                f"{run_dir}: in use by a running dtrain ({holder}); wait for it to end or "
                "stop it (Ctrl-C, or kill that pid), then resume"
            ) from None
        except OSError as exc:  # Lustre without flock, some FUSE mounts, NFS without lockd
            os.close(fd)
            print(
                f"warning: {run_dir}: no lock on this file system ({exc.strerror}); nothing "
                "stops a second launcher from sharing the run dir",
                file=sys.stderr,
            )
            return
    os.ftruncate(fd, 0)
    since = time.strftime("%H:%M:%S")
    os.write(fd, json.dumps({"pid": os.getpid(), "since": since, "argv": sys.argv}).encode())
    _HELD.append(fd)


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(os.pread(fd, 1 << 16, 0))
        command = " ".join(["dtrain", *info.get("argv", [])[1:]])
        return f"pid {info['pid']} since {info['since']}: {command}"
    return "its pid unknown"
