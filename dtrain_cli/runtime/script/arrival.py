"""``init_process_group`` in your own script: a rank that never arrives is named.

    dtrain run dp=2 launcher.rdzv_timeout_s=60 -- train.py

Under torchrun a rank that hangs before ``init_process_group`` (or never calls it) leaves
the others waiting in the process group's store barrier for its timeout (30 minutes by
default) with a message that names no rank. In a ``dtrain run`` worker with torch already
imported, :func:`install` wraps ``torch.distributed.init_process_group``: each rank first
marks its arrival in the agent's store (the c10d store every worker reaches through
``MASTER_ADDR``/``MASTER_PORT``, under this restart attempt's prefix) and waits up to
``launcher.rdzv_timeout_s`` for all ``WORLD_SIZE`` ranks, then calls the real function on
that attempt's namespace of the store (``env://`` as torch does it, but a restarted group
cannot read the addresses an earlier attempt left in the store: gloo then connects to a
dead rank, or hangs). A rank that did not come within that time is named in the error
(``RuntimeError: init_process_group: rank(s) 1 of 2 did not arrive within 60 s``), which
the launcher shows. ``tcp://`` on the agent's port is taken the same way; a script that
passes its own ``store``, or meets at an address of its own (``MASTER_PORT=12355`` set in
the script, processes it starts with ``mp.spawn``), is left to host its own store there,
as under plain ``python`` (:func:`keep_agent_store_to_this_process`); a ``TCPStore`` it
builds at the agent's port is a client of the agent's, as under torchrun
(:func:`client_at_agent_port`). A script that ends
well on several ranks without ever calling it (nor ``init_device_mesh``, which calls it) is
told so by rank 0 (:func:`say_if_alone`), unless it starts processes of its own.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from datetime import timedelta
from typing import Any

from dtrain_cli.rundir import env
from dtrain_cli.rundir.notes import NOT_ARRIVED

PREFIX = "dtrain/script_arrival"
POLL_S = 0.2
_CALLS: list[int] | None = None
"""Calls of the wrapped ``init_process_group`` in this process; None: not wrapped."""


def joined() -> bool | None:
    """Whether the script called ``init_process_group`` (None: not watched, in a spawn
    worker that imported torch.distributed only in the script)."""
    return None if _CALLS is None else bool(_CALLS)


def say_if_alone(rank: int, script_file: str) -> None:
    """Rank 0 of a run on several ranks whose script ended well without ever calling
    ``init_process_group`` says so: every rank then ran the whole job alone (a script that
    takes its rank from a flag torchrun does not pass, or makes its own ``--dist-url``). A
    script that names nothing distributed (one that only splits files by ``RANK``) meant
    to run alone, and is not told."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    asked_help = any(a in ("-h", "--help") for a in sys.argv[1:])  # its help: nothing to join
    if rank == 0 and world > 1 and joined() is False and not asked_help and _told(script_file):
        print(
            f"warning: the script never called init_process_group: its {world} ranks ran "
            "alone, sharing nothing; to train together, call it when WORLD_SIZE > 1 "
            "(torchrun's environment, docs/own-script.md)",
            file=sys.stderr,
        )


SPAWNS = (b"spawn(", b"start_processes(", b"process(", b"processpoolexecutor(")
"""A script's own processes (``mp.spawn``, ``Process(...)``): the ones that may join a group
this process never sees; their script is not told it ran alone."""


def _told(script_file: str) -> bool:
    """Whether the script's text names torch.distributed, DDP, a DistributedSampler ...
    and starts no processes of its own (or cannot be read: then it is told)."""
    try:
        with open(script_file, "rb") as f:
            text = f.read().lower()
    except OSError:
        return True
    return b"distributed" in text and not any(s in text for s in SPAWNS)


def install(timeout_s: float) -> None:
    """Wrap ``init_process_group`` (only when torch.distributed is already imported: a
    spawn worker's fresh interpreter is left as torchrun leaves it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not hasattr(dist, "init_process_group"):
        return
    real = dist.init_process_group
    if getattr(real, "_dtrain_arrival", False):
        return
    global _CALLS, _AGENT
    calls = _CALLS = []
    _AGENT = keep_agent_store_to_this_process()

    @functools.wraps(real)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        bound = inspect.signature(real).bind(*args, **kwargs)
        given = bound.arguments
        if given.get("store") is None and _meets_at_agent(given.get("init_method")):
            store = attempt_store(timeout_s)
            if store is not None:
                wait_for_all_ranks(store, timeout_s)
                # env:// on this attempt's own namespace of the agent's store: a restarted
                # group must not read the addresses the previous attempt left there
                given["init_method"] = None
                given["store"] = store
                if given.get("rank", -1) == -1:
                    given["rank"] = int(os.environ["RANK"])
                if given.get("world_size", -1) == -1:
                    given["world_size"] = int(os.environ["WORLD_SIZE"])
        try:
            return real(*bound.args, **bound.kwargs)
        except RuntimeError as exc:
            hint = nccl_hint(given.get("backend"), str(exc))
            if hint is None:
                raise
            # torch's own error (DistBackendError ...) with the hint at its end, re-raised as
            # it was: one traceback, not a second one below 'The above exception was the
            # direct cause' from a raise in this wrapper
            exc.args = (f"{exc}: {hint}", *exc.args[1:])
            if hint in str(exc):
                raise
            raise RuntimeError(f"{exc}: {hint}").with_traceback(exc.__traceback__) from None

    init_process_group._dtrain_arrival = True  # type: ignore[attr-defined]
    if _AGENT is not None and _AGENT[1].isdigit() and int(_AGENT[1]) > 0:
        dist.TCPStore = client_at_agent_port(dist.TCPStore, int(_AGENT[1]))
    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group
    mesh = sys.modules.get("torch.distributed.device_mesh")  # init_device_mesh's own name
    if getattr(mesh, "init_process_group", None) is real:
        mesh.init_process_group = init_process_group  # type: ignore[union-attr]


def client_at_agent_port(real: type, agent_port: int) -> type:
    """torch's ``TCPStore`` that, failing to host at the agent's port because the port is
    in use (the agent's store is there), is a client there instead: what torch's C++ store
    does for a torchrun worker (``TORCHELASTIC_USE_AGENT_STORE``, kept from this rank's
    children: see :func:`keep_agent_store_to_this_process`). A script's ``TCPStore(
    MASTER_ADDR, MASTER_PORT, world, rank == 0)`` failed on rank 0 with EADDRINUSE. Any
    other failure, or another port, stays the script's; ``isinstance`` of a store torch
    built holds for it as before."""

    class _Same(type(real)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, real)

    class TCPStore(real, metaclass=_Same):  # type: ignore[misc,valid-type]
        __doc__ = real.__doc__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                super().__init__(*args, **kwargs)
            except RuntimeError as exc:  # DistNetworkError
                port = args[1] if len(args) > 1 else kwargs.get("port")
                if port != agent_port or "EADDRINUSE" not in str(exc):
                    raise
                if len(args) > 3:  # host_name, port, world_size, is_master, ...
                    args = (*args[:3], False, *args[4:])
                kwargs.pop("is_master", None)
                super().__init__(*args, **kwargs)

    TCPStore.__module__, TCPStore.__qualname__ = real.__module__, real.__qualname__
    return TCPStore


def nccl_hint(backend: object, error: str) -> str | None:
    """Why ``backend="nccl"`` failed (a script written for GPUs, run where there are none or
    where torch has no NCCL), and what works on both; None for any other error."""
    import torch

    if not isinstance(backend, str) or backend.lower() != "nccl" or "nccl" not in error.lower():
        return None
    asks = "the script asks for backend='nccl'"
    fix = "leave backend unset (torch picks gloo on CPU, nccl on CUDA) or pass 'gloo' here"
    if not torch.cuda.is_available():
        return f"{asks}, which needs CUDA GPUs and this machine has none; {fix}"
    if not torch.distributed.is_nccl_available():
        return f"{asks} and this torch is built without NCCL; {fix}"
    return None


def keep_agent_store_to_this_process() -> tuple[str, str] | None:
    """The agent's store address (None: the agent has none for its workers), taken out of
    the environment that processes the script starts inherit. torch's rendezvous reads
    ``TORCHELASTIC_USE_AGENT_STORE`` at any address: a process the script spawns (the
    ``mp.spawn`` tutorials), or a script that sets its own ``MASTER_PORT``, would then wait
    as a client for a store nobody hosts, under torchrun until the 30-minute timeout.
    Without it rank 0 hosts the store at the script's own address, as with plain
    ``python``; the wrapper keeps the agent's store for a call that meets there."""
    torchrun = os.environ
    if torchrun.pop("TORCHELASTIC_USE_AGENT_STORE", None) != "True":
        return None
    return torchrun.get("MASTER_ADDR", ""), torchrun.get("MASTER_PORT", "")


_AGENT: tuple[str, str] | None = None
"""The agent's store address, kept by :func:`install` (None: no agent store)."""


def _meets_at_agent(init_method: object) -> bool:
    """Whether the rendezvous ``init_method`` names (``env://``: ``MASTER_PORT`` now;
    ``tcp://host:port``, as scripts build it from the same variables) is the agent's store.
    The port decides: on the agent's port is the agent's store, whatever the host is
    called (localhost, 127.0.0.1, the node's name)."""
    if _AGENT is None:
        return False
    if init_method in (None, "env://"):
        port = os.environ.get("MASTER_PORT", "")
    elif isinstance(init_method, str) and init_method.startswith("tcp://"):
        from urllib.parse import urlparse

        try:
            port = str(urlparse(init_method).port)
        except ValueError:
            return False
    else:
        return False
    return port == _AGENT[1]


def attempt_store(timeout_s: float) -> Any:
    """This restart attempt's namespace of the agent's store (None: no agent store)."""
    from torch.distributed import PrefixStore, TCPStore

    if _AGENT is None:
        return None
    try:
        host, port = _AGENT[0], int(_AGENT[1])
        int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None  # not the agent's layout: the real function reports what is missing
    client = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(timeout_s, 1)))
    return PrefixStore(f"{PREFIX}/attempt_{env.restart_count()}", client)


def wait_for_all_ranks(store: Any, timeout_s: float) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store.set(f"arrived/rank_{rank}", "1")
    if world <= 1:
        return
    keys = [f"arrived/rank_{r}" for r in range(world)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store.check(keys):
            return
        time.sleep(POLL_S)
    missing = [r for r in range(world) if not store.check([f"arrived/rank_{r}"])]
    if not missing:
        return
    names = ", ".join(map(str, missing))
    raise RuntimeError(
        NOT_ARRIVED.format(ranks=names, world=world, seconds=timeout_s, first=missing[0])
    )
