"""The warm worker pool: a process that keeps a fork server's imports between launches.

    python -m dtrain_cli.launch.pool_server <slot> <key> <first,modules>   # warm_pool starts it

It imports the worker's entry point (torch and dtrain's runtime), listens on
``<slot>.sock`` and, for each launch that asks (:mod:`.warm_pool`), forks a fork server
for it: the child takes the launch's environment, working directory, ``sys.path``,
umask and standard streams, imports what the launcher announces
(:func:`.server_preload.prepare_server`, as a server the launcher started would), then
runs :func:`multiprocessing.forkserver.main` on the listener and "alive" pipe the launcher
handed over. The agent's requests for workers, their exit codes and the server's end when
the launcher closes its pipe are multiprocessing's own.

Between launches the pool imports what the last ones needed (``torch._dynamo``,
transformers' model code...: modules of the packages its key covers, never your own),
so the next server forks with them. It ends when a launch finds it stale (another key:
dtrain's code, the packages or the environment changed), after ``DTRAIN_WARM_POOL_IDLE_S``
seconds with no launch and no server of its own running, when its socket is removed, and
on ``dtrain pool stop`` or SIGTERM. It ignores a terminal's Ctrl-C and hang-up; it runs
in its own session.
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
import traceback
from pathlib import Path

from dtrain_cli.launch import preload_lists, server_preload  # here, with no hand-off set
from dtrain_cli.launch.warm_pool import EXIT_SLOT_TAKEN
from dtrain_cli.rundir import env

LEARNED_PACKAGES = ("torch", "transformers", "safetensors", "dtrain_cli")
"""Whose modules the pool keeps between launches: the key covers them (dtrain's source,
the installed packages). A module of your own is imported by each launch's server only."""
LOCK_WAIT_S = 10.0  # a stale pool ending


def main(argv: list[str]) -> int:
    where, key, first = Path(argv[0]), argv[1], [m for m in argv[2].split(",") if m]
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    ready = _detach()
    lock = open(f"{where}.lock", "a")  # noqa: SIM115 (held for the pool's life)
    if not _take(lock):
        return EXIT_SLOT_TAKEN
    for name in first:
        importlib.import_module(name)
    listener, inode = _listen(where)
    os.write(ready, b"ok")
    os.close(ready)
    try:
        _serve(listener, where, inode, key, first)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if os.stat(f"{where}.sock").st_ino == inode:
                os.unlink(f"{where}.sock")
    return 0


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


def _take(lock) -> bool:
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
    listener.listen(64)
    os.replace(tmp, f"{where}.sock")
    return listener, os.stat(f"{where}.sock").st_ino


def _serve(listener: socket.socket, where: Path, inode: int, key: str, first: list[str]) -> None:
    children: dict[int, int] = {}  # a server's pid -> the pipe it names its imports on
    learned: list[str] = list(first)
    tried: set[str] = set()  # imported between launches (or failed to)
    idle_s = env.warm_pool_idle_s()
    last_used = time.monotonic()
    while True:
        pending = [m for m in learned if m not in sys.modules and m not in tried]
        busy = not children and bool(pending)
        ready, _, _ = select.select([listener], [], [], 0 if busy else 0.5)
        _reap(children, learned)
        if not _socket_is_ours(where, inode):
            return
        if ready:
            conn, _ = listener.accept()
            with conn:
                if _answer(conn, listener, key, children) != "served":
                    return
            last_used = time.monotonic()
        elif not children:
            if pending:  # between launches, one at a time: what the next one will need
                tried.add(pending[0])
                with contextlib.suppress(Exception):
                    importlib.import_module(pending[0])
            elif time.monotonic() - last_used > idle_s:
                return


def _socket_is_ours(where: Path, inode: int) -> bool:
    try:
        return os.stat(f"{where}.sock").st_ino == inode
    except OSError:
        return False


def _answer(conn: socket.socket, listener: socket.socket, key: str, children: dict) -> str:
    """One request: fork a server (``served``), or end the pool (``stop``, ``stale``)."""
    conn.settimeout(10)
    try:
        message, fds = _receive(conn)
    except (OSError, ValueError):
        return "served"  # a broken request: the launch starts its own server
    try:
        if message.get("stop"):
            conn.sendall(b'{"stopping": true}\n')
            return "stop"
        if message.get("status"):
            state = {
                "pid": os.getpid(),
                "servers": len(children),
                "current": message.get("key") == key,
            }
            conn.sendall(json.dumps(state).encode() + b"\n")
            return "served"
        if message.get("key") != key or len(fds) != 5:
            conn.sendall(b'{"stale": true}\n')
            return "stale"
        learned_r, learned_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            os.close(learned_r)
            _become_server(message, fds, learned_w)  # never returns
        os.close(learned_w)
        children[pid] = learned_r
        conn.sendall(json.dumps({"pid": pid, "pool": os.getpid()}).encode() + b"\n")
        print(f"served launcher {message.get('launcher')}: server {pid}", flush=True)
        return "served"
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 8)
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
    return message, list(fds)


def _become_server(message: dict, fds: list[int], learned_w: int) -> None:
    """In the forked child: become the launch's fork server; exits, never returns."""
    code = 0
    try:
        listener_fd, alive_r, *streams = fds
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
        os.environ.clear()
        os.environ.update(message["env"])
        with contextlib.suppress(OSError):
            os.chdir(message["cwd"])
        os.umask(int(message["umask"]))
        sys.path[:] = message["sys_path"]
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # the pool's own: not its workers'
        os.setpgid(0, 0)  # its own process group: a signal to this launch's, not the pool's
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


def _reap(children: dict[int, int], learned: list[str]) -> None:
    """Servers that ended: what they imported, of the packages the pool keeps, is learned."""
    while children:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        pipe = children.pop(pid, None)
        if pipe is None:
            continue
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(pipe, False)
            names = json.loads(os.read(pipe, 1 << 16) or b"[]")
            learned += [
                n for n in names if n.split(".")[0] in LEARNED_PACKAGES and n not in learned
            ]
        with contextlib.suppress(OSError):
            os.close(pipe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
