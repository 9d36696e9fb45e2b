"""A warm ``python -m dtrain_cli`` for the launch room: the same launch, without importing
torch twice per test.

Every ``dtrain launch`` costs about 8 s of CPU before its first step on this 2-core
machine, most of it two imports of torch: one in the launcher (the elastic agent), one in
the workers' fork server. The launch room runs some 250 launches. This module keeps one
process that has imported them once (:func:`serve`, the way the fork server itself keeps
torch for the workers): each launch is forked from it, sets up what a fresh interpreter
would have (arguments, environment, ``PYTHONPATH``, working directory, stdin, stdout and
stderr, default signal handlers, ``atexit``), and runs ``dtrain_cli``'s ``__main__``. Its
fork server is forked from it too (multiprocessing's ``python -c "from
multiprocessing.forkserver import main; main(...)"``, run in the forked copy with only the
descriptors it is passed), and imports the same preload module, so the workers start as
they do from a fresh server.

What this does not exercise (a fresh interpreter's imports, the ``PYTHONPATH`` a script's
packages need, import-time speed) is covered by the tests that call
:func:`tests.conftest.run_dtrain` with ``fresh=True`` or start ``python -m dtrain_cli``
themselves (``dtrain run``, ``plan``, ``--help``, the signal and preemption drills, SLURM,
Kubernetes). ``DTRAIN_TEST_FRESH=1`` runs every launch the fresh way.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARM_MODULES = (
    "torch",
    "torch.distributed",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.run",
    "torch._dynamo",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.pipelining",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.utils.tensorboard",
    "safetensors.torch",
    "dtrain_cli.cli.app",
    "dtrain_cli.runtime.worker",
    "dtrain_cli.runtime.parallel.pipeline",
    # the HF models' (what their fork server is told to import: HFSpec.worker_modules)
    "transformers",
    "transformers.masking_utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
    "dtrain_cli.models.hf.net",
)
"""What the launcher and the workers import before the first step, here once."""
FORKSERVER_MAIN = "from multiprocessing.forkserver import main"


# ---------------------------------------------------------------- the server process
def serve(path: str) -> None:
    """Import once, then fork a launcher per request until the test session ends."""
    import ctypes
    import importlib

    # this server ends with the test session that started it, however that ends
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        return
    from dtrain_cli.import_gc import imports_without_collection

    with imports_without_collection():  # as dtrain's fork servers: imported, then frozen
        for name in WARM_MODULES:
            importlib.import_module(name)
    base_path = [p for p in sys.path if p and p not in _pythonpath(os.environ)]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # the client waits for the path: it appears once connections are taken (bound to
    # another name, listening, then renamed), not between bind and listen (ECONNREFUSED)
    listener.bind(path + ".bound")
    listener.listen(8)
    os.rename(path + ".bound", path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
        if os.fork() == 0:
            listener.close()
            _monitor(conn, json.loads(message), fds, base_path)  # never returns
        conn.close()
        for fd in fds:
            os.close(fd)


def _monitor(conn: socket.socket, request: dict, fds: list[int], base_path: list[str]) -> None:
    """Fork the launcher, tell the client its pid, then its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become_launcher(request, fds, base_path)
    for fd in fds:  # the client sees the end of output when the launch tree closes them
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    os._exit(0)


def _become_launcher(request: dict, fds: list[int], base_path: list[str]) -> None:
    """What ``python -m dtrain_cli ARGS`` in ``cwd`` with ``env`` would be, then run it."""
    from dtrain_cli.runtime.script.worker import exit_status

    code = 1
    try:
        os.setsid()  # its own session: a timeout stops the whole launch tree
        devnull = os.open(os.devnull, os.O_RDONLY)
        for target, fd in ((0, devnull), (1, fds[0]), (2, fds[1])):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = [os.getcwd(), *_pythonpath(os.environ), *base_path]
        sys.argv = [str(REPO / "dtrain_cli" / "__main__.py"), *request["args"]]
        _default_signal_handlers()
        _fork_the_fork_server()

        try:
            runpy.run_module("dtrain_cli", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exit_status(exc)  # as python exits: None 0, an int, a message 1
        except BaseException:
            traceback.print_exc()
            code = 1
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
    finally:
        os._exit(code)


def _pythonpath(environ: os._Environ | dict) -> list[str]:
    return [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _default_signal_handlers() -> None:
    """A fresh interpreter's: Python's own SIGINT handler, the rest as the OS has them."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _fork_the_fork_server() -> None:
    """multiprocessing starts its fork server as ``python -c CMD``: run CMD in a forked
    copy of this process instead, with only the descriptors it would have been given."""
    from multiprocessing import util

    real = util.spawnv_passfds

    def spawnv_passfds(path: str, args: list[str], passfds: list[int]) -> int:
        command = args[-1]
        if FORKSERVER_MAIN not in command:
            return real(path, args, passfds)  # the resource tracker: as it is
        pid = os.fork()
        if pid:
            return pid
        try:
            keep = {0, 1, 2, *passfds}
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd not in keep:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            sys.argv = ["-c"]
            exec(compile(command, "<forkserver>", "exec"), {"__name__": "__main__"})
        except SystemExit:
            pass
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(0)

    util.spawnv_passfds = spawnv_passfds


# ---------------------------------------------------------------- the client side
class WarmLauncher:
    """The server, started on first use and stopped when the test session ends."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="dtrain-warm-")
        self.path = os.path.join(self._dir, "sock")
        # The fork server and workers forked from it carry this command line, as theirs
        # carries multiprocessing's: the launcher's orphan sweep keeps them alike
        # (dtrain_cli.launch.signals.KEPT_HELPERS).
        code = f"from tests.warm_launcher import serve; serve({self.path!r})"
        self._log = os.path.join(self._dir, "server.log")
        with open(self._log, "w") as log:  # not the session's stdout: CI waits for its end
            self._proc = subprocess.Popen(
                [sys.executable, "-c", f"{code}  # {FORKSERVER_MAIN}"],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
        deadline = time.monotonic() + 120
        while not os.path.exists(self.path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the warm launcher did not start: {self._tail()}")
            time.sleep(0.05)
        atexit.register(self.stop)

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait(10)

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return Path(self._log).read_text()[-2000:]
        return ""

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """``subprocess.run([python, -m, dtrain_cli, *args], capture_output=True, ...)``."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            request = {"args": args, "cwd": str(cwd), "env": env}
            socket.send_fds(conn, [json.dumps(request).encode()], [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        replies = conn.makefile("r")
        pid = json.loads(replies.readline())["pid"]
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        readers = [threading.Thread(target=_read_all, args=(fd, chunks[fd])) for fd in chunks]
        for reader in readers:
            reader.start()
        conn.settimeout(timeout)
        try:
            line = replies.readline()
        except TimeoutError:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            for reader in readers:
                reader.join(10)
            raise subprocess.TimeoutExpired(["dtrain", *args], timeout) from None
        finally:
            conn.close()
        for reader in readers:
            reader.join(timeout)
        out, err = (_text(b"".join(chunks[fd])) for fd in (out_r, err_r))
        return subprocess.CompletedProcess(args, json.loads(line)["returncode"], out, err)


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: universal newlines."""
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _read_all(fd: int, into: list[bytes]) -> None:
    try:
        while data := os.read(fd, 65536):
            into.append(data)
    finally:
        os.close(fd)


_warm: WarmLauncher | None = None


def warm_launcher() -> WarmLauncher:
    global _warm
    if _warm is None:
        _warm = WarmLauncher()
    return _warm
