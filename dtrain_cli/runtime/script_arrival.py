"""``init_process_group`` in your own script: a rank that never arrives is named.

    dtrain run dp=2 launcher.rdzv_timeout_s=60 -- train.py

Under torchrun a rank that hangs before ``init_process_group`` (or never calls it) leaves
the others waiting in the process group's store barrier for its timeout (30 minutes by
default) with a message that names no rank. In a ``dtrain run`` worker with torch already
imported, :func:`install` wraps ``torch.distributed.init_process_group``: each rank first
marks its arrival in the agent's store (the c10d store every worker reaches through
``MASTER_ADDR``/``MASTER_PORT``, under this restart attempt's prefix) and waits up to
``launcher.rdzv_timeout_s`` for all ``WORLD_SIZE`` ranks, then calls the real function
unchanged. A rank that did not come within that time is named in the error
(``RuntimeError: init_process_group: rank(s) 1 of 2 did not arrive within 60 s``), which
the launcher shows. Scripts that pass their own ``store`` or ``init_method`` other than
``env://`` are left alone.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from datetime import timedelta
from typing import Any

PREFIX = "dtrain/script_arrival"
POLL_S = 0.2


def install(timeout_s: float) -> None:
    """Wrap ``init_process_group`` (only when torch.distributed is already imported: a
    spawn worker's fresh interpreter is left as torchrun leaves it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not hasattr(dist, "init_process_group"):
        return
    real = dist.init_process_group
    if getattr(real, "_dtrain_arrival", False):
        return

    @functools.wraps(real)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        init_method = kwargs.get("init_method") or (args[1] if len(args) > 1 else None)
        if kwargs.get("store") is None and init_method in (None, "env://"):
            wait_for_all_ranks(timeout_s)
        return real(*args, **kwargs)

    init_process_group._dtrain_arrival = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


def wait_for_all_ranks(timeout_s: float) -> None:
    from torch.distributed import PrefixStore, TCPStore

    env = os.environ
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return  # not the agent's layout: the real function reports what is missing
    if world <= 1 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return  # one rank, or no agent store to meet in
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    client = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(timeout_s, 1)))
    store = PrefixStore(f"{PREFIX}/{attempt}", client)
    store.set(f"rank_{rank}", "1")
    keys = [f"rank_{r}" for r in range(world)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store.check(keys):
            return
        time.sleep(POLL_S)
    missing = [r for r in range(world) if not store.check([f"rank_{r}"])]
    if not missing:
        return
    names = ", ".join(map(str, missing))
    raise RuntimeError(
        f"init_process_group: rank(s) {names} of {world} did not arrive within "
        f"{timeout_s:g} s (launcher.rdzv_timeout_s); see logs/rank_{missing[0]}.log"
    )
