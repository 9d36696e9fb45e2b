"""The warm worker pool, the launcher's side: ask it for this launch's fork server.

    dtrain launch recipe=gpt_tiny dp=2      # the first launch starts the pool (and uses it)
    dtrain launch recipe=gpt_tiny dp=2      # the next one gets a server with everything imported
    DTRAIN_WARM_POOL=0 dtrain launch ...    # no pool: each launch starts its own server
    dtrain pool stop                        # end it now (it ends by itself after 10 idle min)

A launch's workers are forked from a fork server that has imported torch, dtrain's worker
and what the layout needs before step 1 (``torch._dynamo`` for DDP, transformers for a
Hugging Face model): about 2 s of imports on one core, the critical path of the start-up
(:mod:`.worker_server`). The pool (:mod:`.pool_server`) is a process that keeps those
imports and outlives the launch that started it. A launch connects to it and hands over
what :mod:`multiprocessing.forkserver` would give a server it started itself (the
listening socket and the "alive" pipe), with its environment, working directory,
``sys.path`` and standard streams; the pool forks a server that takes them and serves the
agent with multiprocessing's own protocol. The workers are then exactly as before, only
forked from a process that was ready before the launch began.

The pool is keyed by what its imports depend on and what the workers would inherit from
it (:func:`pool_key`): dtrain's source, the installed packages (site-packages and the user
site), the Python and its flags, the variables torch and transformers read at import, the
launcher's cgroup and nice value. A launch whose key differs finds the pool stale: the pool
ends and the launch starts another (the pool also checks the files of every module it
holds before each launch); a stale pool still serving a run lives on, not listening, until
that run ends. CPU affinity and resource limits go with each request.

Its files are in ``<tmp>/dtrain-pool-<uid>/`` (a socket, a lock, a log; the folder and the
socket are this user's alone), one slot per dtrain checkout and Python. Not used inside a
SLURM job or a Kubernetes pod (one launch per allocation), or when the pool does not answer
in time: then the launch starts its own server, as without a pool. A server is a child
subreaper: what your script's ranks leave running stays in its tree, where ``dtrain run``
ends it (:func:`.signals.no_orphans`); when a launcher is gone, however it ended, the pool
ends its server's process group. Torch-free.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import site
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dtrain_cli.rundir import env
from dtrain_cli.source_stats import CODE_ROOT, code_files, stats

CONNECT_WAIT_S = 60.0
"""How long a launch waits for a pool it started (importing torch and the worker)."""
ASK_TIMEOUT_S = 10.0
"""How long one request waits for the pool's answer (it may be importing a module)."""
IMPORT_ENV_PREFIXES = (
    "PYTHON",
    "LD_",
    "TORCH",
    "PYTORCH",
    "OMP_",
    "MKL_",
    "KMP_",
    "HF_",
    "TRANSFORMERS_",
)
"""Variables read at import (paths, torch's and transformers' settings): part of the key.
(Device selection, ``CUDA_VISIBLE_DEVICES`` and NCCL's, is read when CUDA or NCCL starts,
in a worker; never in the pool, which must not start CUDA before it forks.)"""
RLIMITS = ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_MEMLOCK")
POOL_MODULE = "dtrain_cli.launch.pool_server"
EXIT_SLOT_TAKEN = 3
"""The pool's exit code when another pool holds the slot (:mod:`.pool_server`)."""
SLOT_TAKEN_WAIT_S = 3.0  # the pool that holds it should answer by then; if not, no pool


@dataclass(kw_only=True)
class PoolServer:
    """A fork server the pool forked for this launch."""

    pid: int
    address: str
    alive_w: int  # this launch's end of the "alive" pipe: closing it ends the server


def wanted() -> bool:
    return env.warm_pool_wanted() and not env.in_scheduler_job() and hasattr(socket, "send_fds")


def slot() -> Path:
    """``<tmp>/dtrain-pool-<uid>/<slot>``: one pool per dtrain checkout and Python, in a
    folder that is this user's alone (OSError otherwise: the launch starts its own server)."""
    folder = Path(env.warm_pool_dir() or Path(tempfile.gettempdir()) / f"dtrain-pool-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise OSError(f"{folder} is not a folder of this user's")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)  # ours: others may not reach the pool's socket
    owner = f"{sys.executable}\0{CODE_ROOT}"
    return folder / hashlib.sha256(owner.encode()).hexdigest()[:16]


def pool_key() -> str:
    """What the pool's imports depend on, and what its servers' workers inherit from it."""
    site_dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    site_dirs.add(site.getusersitepackages())
    parts = [
        sys.version,
        sys.executable,
        subprocess._args_from_interpreter_flags(),  # -O, -X, -W...: the pool runs with them
        stats(code_files()),
        stats(Path(p) for p in sorted(site_dirs)),  # a package installed or removed: a miss
        sorted((k, v) for k, v in os.environ.items() if k.startswith(IMPORT_ENV_PREFIXES)),
        _own_cgroup(),
        os.getpriority(os.PRIO_PROCESS, 0),
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def process_settings() -> dict:
    """What a server forked elsewhere takes from this launcher (:mod:`.pooled_server`)."""
    limits = {n: resource.getrlimit(getattr(resource, n)) for n in RLIMITS if hasattr(resource, n)}
    return {"affinity": sorted(os.sched_getaffinity(0)), "rlimits": limits}


class PoolRequest:
    """Ask the pool for a fork server, in a thread, while the launcher composes and plans:
    connect at once, or start the pool and connect when it listens. :meth:`result` waits."""

    def __init__(self, *, environ: dict[str, str], first: tuple[str, ...]) -> None:
        from multiprocessing.connection import arbitrary_address

        self._listener = socket.socket(socket.AF_UNIX)
        self._address = arbitrary_address("AF_UNIX")
        self._listener.bind(self._address)
        os.chmod(self._address, 0o600)
        self._listener.listen()
        self._alive_r, self._alive_w = os.pipe()
        self._environ = environ
        self._message = {
            "key": pool_key(),
            "env": environ,
            "cwd": os.getcwd(),
            "sys_path": sys.path,
            "umask": _umask(),
            "launcher": os.getpid(),
            "settings": process_settings(),
        }
        self.first = first
        self._server: PoolServer | None = None
        self._lock = threading.Lock()
        self._cancelled = False
        self.started: int | None = None  # the pid of a pool this request started
        self._thread = threading.Thread(target=self._connect, daemon=True, name="dtrain-pool")
        self._thread.start()

    def result(self, timeout: float = CONNECT_WAIT_S) -> PoolServer | None:
        """The server, or None (no pool answered): the launch starts its own."""
        self._thread.join(timeout)
        if self._thread.is_alive() or self._server is None:
            self.cancel()
            return None
        return self._server

    def cancel(self) -> None:
        """Not used: nothing of the request is left (a server already forked for it is
        ended; one forked later ends at once, its "alive" pipe closed)."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            if self._server is not None:
                with contextlib.suppress(OSError):
                    os.kill(self._server.pid, 9)
            else:
                with contextlib.suppress(OSError):
                    os.close(self._alive_r)
            with contextlib.suppress(OSError):
                os.close(self._alive_w)
            with contextlib.suppress(OSError):
                self._listener.close()

    def _connect(self) -> None:
        try:
            self._ask_or_start(slot())
        except Exception:  # an unusable pool folder...: this launch starts its own server
            return

    def _ask_or_start(self, where: Path) -> None:
        deadline = time.monotonic() + CONNECT_WAIT_S
        pool: subprocess.Popen | None = None
        streams, opened = _standard_streams()
        try:
            while time.monotonic() < deadline and not self._cancelled:
                fds = [self._listener.fileno(), self._alive_r, *streams]
                answer = _ask(where, self._message, fds)
                if answer is not None and "pid" in answer:
                    self._take(answer)
                    return
                stale = answer is not None and answer.get("stale")
                if answer is not None and not stale:
                    return  # a pool that refuses: this launch starts its own server
                if pool is None or stale:
                    pool = start_pool(where, self.first, self._message["key"], self._environ)
                    self.started = pool.pid  # until the pool says its own (it detaches)
                elif pool.poll() == EXIT_SLOT_TAKEN:
                    self.started = None  # another launch's pool: this one asks that
                    deadline = min(deadline, time.monotonic() + SLOT_TAKEN_WAIT_S)
                elif pool.poll() not in (None, 0):  # 0: it listens (the next ask connects)
                    return  # it failed (its log says why)
                time.sleep(0.01)
        finally:
            for fd in opened:
                os.close(fd)

    def _take(self, answer: dict) -> None:
        with self._lock:
            server = PoolServer(
                pid=int(answer["pid"]), address=self._address, alive_w=self._alive_w
            )
            if self._cancelled:  # too late: the launch has its own server
                with contextlib.suppress(OSError):
                    os.kill(server.pid, 9)
                return
            self._server = server
            if self.started is not None:
                self.started = int(answer.get("pool", self.started))
            os.close(self._alive_r)  # the server has its copies
            with contextlib.suppress(OSError):
                self._listener.close()


def start_pool(
    where: Path, first: tuple[str, ...], key: str, environ: dict[str, str]
) -> subprocess.Popen:
    """A new pool, with this launch's key, environment (less the hand-off to a server) and
    interpreter flags, its output in ``<slot>.log``. It runs from the folder dtrain_cli is
    in, so it imports this dtrain; a second pool of the same slot ends at once (the lock)."""
    environ = {k: v for k, v in environ.items() if not k.startswith("DTRAIN_PRELOAD")}
    flags = subprocess._args_from_interpreter_flags()
    with open(f"{where}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, *flags, "-m", POOL_MODULE, str(where), key, ",".join(first)],
            cwd=CODE_ROOT.parent,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )


def stop_pool() -> bool:
    """Ask this slot's pool to end; False when none answers."""
    return _ask(slot(), {"stop": True}, []) is not None


def pool_status() -> dict | None:
    """This slot's pool: its pid, the servers it runs now, whether it is current (its key is
    this command's); None when none answers."""
    return _ask(slot(), {"status": True, "key": pool_key()}, [])


def _ask(where: Path, message: dict, fds: list[int]) -> dict | None:
    """One request to the pool at ``where``; None when no pool listens there (or answers)."""
    data = json.dumps(message).encode()
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(ASK_TIMEOUT_S)
            sock.connect(f"{where}.sock")
            socket.send_fds(sock, [struct.pack("!Q", len(data)) + data], fds)
            reply = sock.makefile("rb").readline()
    except OSError:
        return None
    try:
        answer = json.loads(reply)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _standard_streams() -> tuple[list[int], list[int]]:
    """This process's stdin, stdout and stderr for the server (and so the workers) to
    write to, /dev/null for one that is closed; and the descriptors opened for that."""
    out, opened = [], []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            out.append(fd)
        except OSError:
            opened.append(os.open(os.devnull, os.O_RDWR))
            out.append(opened[-1])
    return out, opened


def _own_cgroup() -> str:
    try:
        return Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
