"""The warm worker pool: a process that keeps a fork server's imports between launches.

    python -m dtrain_cli.launch.pool_server <slot> <key> <first,modules>   # warm_pool starts it

It imports the worker's entry point (torch and dtrain's runtime), listens on
``<slot>.sock`` (mode 0600, and only its own user is answered) and, for each launch that
asks (:mod:`.warm_pool`), forks a fork server for it (:mod:`.pooled_server`: the child
takes the launch's process settings, imports what the launcher announces and runs
:func:`multiprocessing.forkserver.main` on the listener and "alive" pipe the launcher
handed over). The agent's requests for workers and their exit codes are multiprocessing's
own. When a launcher is gone (however it ended: a SIGKILL of its process group too), the
pool SIGKILLs the process group of its server: the server, its workers and what they left.

Between launches the pool imports what the last ones needed (``torch._dynamo``,
transformers' model code...: modules of the packages its key covers, never your own),
so the next server forks with them. Before each launch it checks that no file of a module
it holds changed (an editable install edited); if one did, or the launch's key differs
(dtrain's code, the packages, the interpreter's flags or the environment changed), it is
stale and ends. It ends too after ``DTRAIN_WARM_POOL_IDLE_S``
seconds with no launch and no server of its own running, when its socket is removed, and
on ``dtrain pool stop`` or SIGTERM. Ending (SIGTERM aside) it stops serving and frees its
slot at once, and waits for the servers it runs: their launchers' ends still end them.
It ignores a terminal's Ctrl-C and hang-up; it runs in its own session.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dtrain_cli.launch import pooled_server  # here, with no hand-off set (it imports the preload)
from dtrain_cli.launch.warm_pool import EXIT_SLOT_TAKEN
from dtrain_cli.rundir import env
from dtrain_cli.rundir.protocol import STEP_SIGNALS

LEARNED_PACKAGES = ("torch", "transformers", "safetensors", "dtrain_cli")
"""Whose modules the pool keeps between launches: the key covers them (dtrain's source,
the installed packages) and so do the pool's own checks of their files. A module of your
own is imported by each launch's server only."""
LOCK_WAIT_S = 10.0  # a stale pool ending
REQUEST_TIMEOUT_S = 5.0


@dataclass(kw_only=True)
class Served:
    """A server the pool forked, until it is reaped."""

    learned_r: int  # it names what it imported here
    launcher: int | None  # a pidfd of its launcher: readable once the launcher is gone


@dataclass(kw_only=True)
class Pool:
    listener: socket.socket
    where: Path
    inode: int
    key: str
    servers: dict[int, Served] = field(default_factory=dict)
    learned: list[str] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)  # imported between launches (or failed to)
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)  # file -> size, mtime


def main(argv: list[str]) -> int:
    where, key, first = Path(argv[0]), argv[1], [m for m in argv[2].split(",") if m]
    for sig in STEP_SIGNALS:  # a launcher may start it while it ignores them
        signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    ready = _detach()
    lock = os.open(f"{where}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if not _take(lock):
        return EXIT_SLOT_TAKEN
    for name in first:
        importlib.import_module(name)
    listener, inode = _listen(where)
    pool = Pool(listener=listener, where=where, inode=inode, key=key, learned=list(first))
    _stamp_new_modules(pool)
    os.write(ready, b"ok")
    os.close(ready)
    try:
        _serve(pool, lock)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if os.stat(f"{where}.sock").st_ino == inode:
                os.unlink(f"{where}.sock")
    os.close(lock)  # the slot is free: a launch may start the next pool now
    _guard(pool)
    return 0


def _guard(pool: Pool) -> None:
    """No longer serving, the pool still watches the servers it runs: a launcher gone ends
    its server's process group, as while serving, and the pool ends with the last of them
    (a stale pool that another launch replaced keeps a running launch's workers tied to
    their launcher)."""
    while pool.servers:
        watched = [s.launcher for s in pool.servers.values() if s.launcher is not None]
        ready, _, _ = select.select(watched, [], [], 0.5)
        _end_orphaned_servers(pool, ready)
        _reap(pool)


def _detach() -> int:
    """The pool is no launcher's child (a ``dtrain run`` launcher is a child subreaper that
    ends its descendants): the process the launcher started forks the pool, in a session
    of its own, and leaves once it listens (exit 0) or has failed (its exit code). Returns
    the pool's end of that pipe."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.setsid()
        return ready_w
    os.close(ready_w)
    if os.read(ready_r, 2) == b"ok":
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) or 1)


def _take(lock: int) -> bool:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _listen(where: Path) -> tuple[socket.socket, int]:
    """Bind under a private name, then rename: a launch never connects to a half-made pool."""
    tmp = f"{where}.{os.getpid()}.new"
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(tmp)
    os.chmod(tmp, 0o600)
    listener.listen(64)
    os.replace(tmp, f"{where}.sock")
    return listener, os.stat(f"{where}.sock").st_ino


def _serve(pool: Pool, lock: int) -> None:
    idle_s = env.warm_pool_idle_s()
    last_used = time.monotonic()
    while True:
        pending = [m for m in pool.learned if m not in sys.modules and m not in pool.tried]
        busy = not pool.servers and bool(pending)
        watched = [s.launcher for s in pool.servers.values() if s.launcher is not None]
        ready, _, _ = select.select([pool.listener, *watched], [], [], 0 if busy else 0.5)
        _end_orphaned_servers(pool, ready)
        _reap(pool)
        if not _socket_is_ours(pool.where, pool.inode):
            return
        if pool.listener in ready:
            conn, _ = pool.listener.accept()
            with conn:
                if _answer(pool, conn, lock) != "served":
                    return
            last_used = time.monotonic()
        elif not pool.servers:
            if pending:  # between launches, one at a time: what the next one will need
                pool.tried.add(pending[0])
                with contextlib.suppress(Exception):
                    importlib.import_module(pending[0])
                _stamp_new_modules(pool)
            elif time.monotonic() - last_used > idle_s:
                return


def _socket_is_ours(where: Path, inode: int) -> bool:
    try:
        return os.stat(f"{where}.sock").st_ino == inode
    except OSError:
        return False


def _answer(pool: Pool, conn: socket.socket, lock: int) -> str:
    """One request: fork a server (``served``), or end the pool (``stop``, ``stale``)."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    fds: list[int] = []
    try:
        if _peer_uid(conn) != os.getuid():
            return "served"  # another user: no answer
        message, fds = _receive(conn)
        if message.get("stop"):
            conn.sendall(b'{"stopping": true}\n')
            return "stop"
        if message.get("status"):
            state = {"pid": os.getpid(), "servers": len(pool.servers)}
            state["current"] = message.get("key") == pool.key and _stamps_current(pool)
            conn.sendall(json.dumps(state).encode() + b"\n")
            return "served"
        if message.get("key") != pool.key or len(fds) != 5 or not _stamps_current(pool):
            conn.sendall(b'{"stale": true}\n')
            return "stale"
        pid = _fork_server(pool, message, fds, lock)
        conn.sendall(json.dumps({"pid": pid, "pool": os.getpid()}).encode() + b"\n")
        print(f"served launcher {message.get('launcher')}: server {pid}", flush=True)
        return "served"
    except (OSError, ValueError):
        return "served"  # a broken request: that launch starts its own server
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _fork_server(pool: Pool, message: dict, fds: list[int], lock: int) -> int:
    learned_r, learned_w = os.pipe()
    try:
        launcher = os.pidfd_open(int(message["launcher"]))
    except (OSError, KeyError, ValueError, AttributeError):
        launcher = None
    pid = os.fork()
    if pid == 0:
        pool.listener.close()
        os.close(lock)  # a server (and its workers) must not hold the slot's lock
        os.close(learned_r)
        if launcher is not None:
            os.close(launcher)
        pooled_server.become_server(message, fds, learned_w)  # never returns
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # as the child does: its group exists before we may end it
    os.close(learned_w)
    pool.servers[pid] = Served(learned_r=learned_r, launcher=launcher)
    return pid


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 8)
    fds = list(fds)
    try:
        if len(data) < 8:
            raise ValueError("short request")
        (size,) = struct.unpack("!Q", data[:8])
        body = data[8:]
        while len(body) < size:
            more = conn.recv(size - len(body))
            if not more:
                raise ValueError("short request")
            body += more
        message = json.loads(body)
        if not isinstance(message, dict):
            raise ValueError("not a request")
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    return message, fds


def _end_orphaned_servers(pool: Pool, ready: list) -> None:
    """A launcher that is gone (its pidfd readable): SIGKILL its server's process group,
    its workers and what they left included, as its own process group would have been."""
    for pid, served in pool.servers.items():
        if served.launcher is not None and served.launcher in ready:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            os.close(served.launcher)
            served.launcher = None


def _reap(pool: Pool) -> None:
    """Servers that ended: what they imported, of the packages the pool keeps, is learned."""
    while pool.servers:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        served = pool.servers.pop(pid, None)
        if served is None:
            continue
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(served.learned_r, False)
            names = json.loads(os.read(served.learned_r, 1 << 16) or b"[]")
            pool.learned += [
                n for n in names if n.split(".")[0] in LEARNED_PACKAGES and n not in pool.learned
            ]
        for fd in (served.learned_r, served.launcher):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if served.launcher is not None:  # its run is over: what its group still holds goes too
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def _stamp_new_modules(pool: Pool) -> None:
    """Size and mtime of each file of a module the pool holds (of the packages it keeps)."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and name.split(".")[0] in LEARNED_PACKAGES and path not in pool.stamps:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                pool.stamps[path] = (st.st_size, st.st_mtime_ns)


def _stamps_current(pool: Pool) -> bool:
    """No file the pool imported has changed since (an editable install edited...)."""
    for path, stamp in pool.stamps.items():
        try:
            st = os.stat(path)
        except OSError:
            return False
        if (st.st_size, st.st_mtime_ns) != stamp:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
