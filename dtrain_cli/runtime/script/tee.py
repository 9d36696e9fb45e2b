"""A ``dtrain run`` rank's stdout and stderr to the console and to ``logs/rank_<k>.log``.

    with tee_output(run.rank_log(rank)):
        run_as_main(script)        # print(), C extensions, forked children: fds 1 and 2

fds 1 and 2 become pipes, read by a process forked from the rank (the tee) that writes each
whole line to the console the fd was on and to the log. The tee is a process and not a
thread of the rank because the rank may die at any instruction: a SIGKILL from the kernel's
OOM killer, a segmentation fault in a C extension, an NCCL abort. What it wrote last (the
lines that say why) is then still in the pipe, and a thread of the rank would die with it
(a user's segfaulting rank left only its first line in its log). The tee reads to the
pipe's end, after the rank's death as before it; it ignores the signals a launcher sends
its group (Ctrl-C, SIGTERM, preemption), so it ends only when every writer has. Pure
``os`` calls in the tee (forked from a process with threads: no lock of theirs is taken).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import signal
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from dtrain_cli.rundir.protocol import TEE_PROCESS_NAME

PARTIAL_LINE_S = 0.25
"""How long an unfinished line (a prompt, a progress bar without ``\\r``) waits for its end
before it is forwarded as it is."""
PIPE_BUF = 4096
"""Writes up to this size reach a pipe whole (POSIX): one rank's lines never splice with
another's on a shared console."""

DRAIN_S = 30.0
"""How long a rank's end waits for its output to reach the console and its log (so the
launcher's last line comes after them): a loaded machine can keep the tee from running for
seconds. A child of the script that still holds the pipe ends the wait as soon as
everything written so far is forwarded. Nothing is lost either way: the tee outlives the
rank."""

TEE_IGNORES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""What a launcher sends a rank's process group; the tee ends at the pipes' end instead."""


IDLE, ENDED, PIPE_ENDED, PID = 0, 1, 2, 4
"""The memory the tee shares with the rank: byte IDLE is 1 while it waits for data with
nothing held back, ENDED once both pipes ended, PIPE_ENDED + i once pipe i's end (and its
last line) went out; the tee's pid at PID (4 bytes)."""


class _Tee:
    """The running tee as the rank sees it: its ends of the pipes and the shared flags."""

    def __init__(self, consoles: dict[int, int], read_ends: list[int], flags: mmap.mmap) -> None:
        self.consoles, self.read_ends, self.flags = consoles, read_ends, flags
        self.pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):  # a tee that died ends the wait
            self.pidfd = os.pidfd_open(struct.unpack_from("i", flags, PID)[0])

    def forwarded_all(self) -> bool:
        """It ended or died, or every pipe ended or is neither unread nor at an end the tee
        has yet to forward (a child of the script holds it), while the tee is idle (checked
        in this order: a tee forwarding when the pipes were found so sets its flag only
        after it wrote everything out)."""
        if self.flags[ENDED] or (self.pidfd is not None and _readable(self.pidfd)):
            return True
        for i, fd in enumerate(self.read_ends):
            if not self.flags[PIPE_ENDED + i] and _readable(fd):
                return False
        return self.flags[IDLE] == 1

    def close(self) -> None:
        for fd in [*self.read_ends, *([self.pidfd] if self.pidfd is not None else [])]:
            os.close(fd)


_running: list[_Tee] = []


@contextlib.contextmanager
def tee_output(path: Path) -> Iterator[None]:
    """fds 1 and 2 to the console they were on and to ``path``, a whole line at a time,
    through a forked tee (see the module's doc)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    consoles = {fd: os.dup(fd) for fd in (1, 2)}
    pipes = {fd: os.pipe() for fd in (1, 2)}
    flags = mmap.mmap(-1, 8)  # anonymous and shared: the tee's writes are seen here
    try:
        _start_tee([(pipes[fd][0], consoles[fd]) for fd in (1, 2)], log, pipes, flags)
    except OSError as exc:  # no process to spare (ulimit -u): the console alone
        for fd in (log, *consoles.values(), *(end for pair in pipes.values() for end in pair)):
            os.close(fd)
        print(f"warning: {path} not written: cannot start its tee ({exc})", file=sys.stderr)
        yield
        return
    os.close(log)
    for fd, (_, write_end) in pipes.items():
        os.dup2(write_end, fd)
        os.close(write_end)
    _running.append(_Tee(consoles, [r for r, _ in pipes.values()], flags))
    try:
        yield
    finally:
        drain_output()


def drain_output() -> None:
    """Put fds 1 and 2 back on the console and wait until the tee has forwarded what is
    left: it ended (it saw the pipes' end), or (a child of the script still holds a pipe)
    nothing was left unread for longer than an unfinished line waits; at most
    :data:`DRAIN_S`."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    while _running:
        tee = _running.pop()
        for fd, console in tee.consoles.items():
            os.dup2(console, fd)  # this rank's write ends close: the tee sees the end
            os.close(console)
        _wait_for(tee)
        tee.close()


def _wait_for(tee: _Tee) -> None:
    """Until the tee ended or forwarded all there is, at most :data:`DRAIN_S`."""
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and not tee.forwarded_all():
        time.sleep(0.005)


def _readable(fd: int) -> bool:
    """Data to read, or an end (a pipe without writers; a pidfd: its process ended)."""
    return bool(select.select([fd], [], [], 0)[0])


def _start_tee(
    pairs: list[tuple[int, int]], log: int, pipes: dict[int, tuple[int, int]], flags: mmap.mmap
) -> None:
    """Fork twice: the tee is no child of the rank (a script's ``os.wait()`` for its own
    children would wait for it), but of the launcher's subreaper once its parent left. The
    launcher's signals are held until the tee ignores them (a Ctrl-C in between ran the
    rank's handler in it), and it keeps no other file of the rank's (multiprocessing's pipe
    that tells the agent a ``fork`` rank ended would stay open while the tee lives)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, TEE_IGNORES)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    if pid:
        try:
            with contextlib.suppress(ChildProcessError):  # SIGCHLD ignored: reaped already
                _, status = os.waitpid(pid, 0)  # the parent between: gone at once
                if os.waitstatus_to_exitcode(status):
                    raise OSError("no second fork (the tee's own)")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return
    code = 1
    try:
        if (tee := os.fork()) == 0:
            for sig in TEE_IGNORES:
                signal.signal(sig, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            _keep_only([fd for pair in pairs for fd in pair] + [log])
            _name_process()
            pump(pairs, log, flags)
            flags[ENDED] = 1
        else:
            struct.pack_into("i", flags, PID, tee)
        code = 0
    finally:
        os._exit(code)  # none of the rank's exit handlers: they are the rank's to run


def _keep_only(keep: list[int]) -> None:
    """Close every fd of this process but ``keep``: the pipes' write ends (else the tee
    never sees their end), and whatever else the rank had open."""
    for fd in (int(name) for name in os.listdir("/proc/self/fd")):
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _name_process() -> None:
    """``dtrain-tee`` in ``ps`` and ``/proc/<pid>/comm`` (prctl PR_SET_NAME)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(TEE_PROCESS_NAME), 0, 0, 0)


def pump(pairs: list[tuple[int, int]], log: int, flags: mmap.mmap) -> None:
    """Each (read end, console) pair to its console and the log, whole lines; a line still
    unfinished after :data:`PARTIAL_LINE_S` goes as it is, and one still unfinished at the
    end gets its newline (the launcher's next line is not glued to it). ``flags[IDLE]`` is 1
    while it waits with nothing held back."""
    console = dict(pairs)
    index = {r: i for i, (r, _) in enumerate(pairs)}
    pending = dict.fromkeys(console, b"")
    ended = dict.fromkeys(console, True)  # what went out last ended a line
    since: dict[int, float] = {}

    def send(r: int, data: bytes) -> None:
        if data:
            forward(data, console[r], log)
            ended[r] = data.endswith(b"\n")

    while console:
        waits = [since[r] + PARTIAL_LINE_S - time.monotonic() for r in console if pending[r]]
        flags[IDLE] = 0 if waits else 1
        ready = select.select(list(console), [], [], max(min(waits), 0) if waits else None)[0]
        flags[IDLE] = 0
        for r in ready:
            data = os.read(r, 65536)
            if not data:  # every writer is gone
                send(r, pending.pop(r))
                send(r, b"" if ended[r] else b"\n")
                del console[r]
                flags[PIPE_ENDED + index[r]] = 1
                continue
            if not pending[r]:  # an unfinished line waits from its start, however it grows
                since[r] = time.monotonic()
            pending[r] += data
            cut = max(pending[r].rfind(b"\n"), pending[r].rfind(b"\r")) + 1
            send(r, pending[r][:cut])
            pending[r] = pending[r][cut:]
            if cut:
                since[r] = time.monotonic()
        for r in console:
            if pending[r] and time.monotonic() - since[r] >= PARTIAL_LINE_S:
                send(r, pending[r])  # an unfinished line waited
                pending[r] = b""


def forward(data: bytes, console: int, log: int) -> None:
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
