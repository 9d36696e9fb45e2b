"""Every environment variable one dtrain process hands another, written and read here only.

    DTRAIN_LAUNCH_T0=...  dtrain launch ...   # the launch's start: step 1 is timed from it

The launcher sets the launch start time and the fork server's preload hand-off; the
worker sets the run dir for its fault drills; ``dtrain run`` sets the run dir, plan and
config paths for your script (:mod:`dtrain_cli.script_env` reads them); torch's agent sets
the restart count. The user sets ``DTRAIN_CACHE``, ``DTRAIN_CONFIG_PATH`` and the drills'
``DTRAIN_FAULTS``. The scheduler's own variables (SLURM's, Kubernetes') that dtrain acts on
are read here too. Torch-free.
"""

from __future__ import annotations

import os
import time
from collections.abc import MutableMapping
from pathlib import Path

RUN_DIR = "DTRAIN_RUN_DIR"
PLAN = "DTRAIN_PLAN"
CONFIG = "DTRAIN_CONFIG"
LAUNCH_T0 = "DTRAIN_LAUNCH_T0"
"""Epoch seconds when the launch command started (start-up breakdown, time to step 1)."""
CACHE = "DTRAIN_CACHE"
"""The token-cache root (``data.cache_dir`` wins; default ``~/.cache/dtrain``)."""
CONFIG_PATH = "DTRAIN_CONFIG_PATH"
"""Extra config folders, ``:``-separated (as ``--config-dir``)."""
FAULTS = "DTRAIN_FAULTS"
"""Fault drills (:mod:`dtrain_cli.runtime.diagnostics.faults`)."""
VALIDATE_HANG_RANK = "DTRAIN_VALIDATE_HANG_RANK"
"""A drill of ``dtrain validate-cluster``: this rank never arrives."""
LAUNCHER_PID = "DTRAIN_LAUNCHER_PID"
"""The launch command whose agent starts the workers (set with the launch start, before its
fork server starts): a worker ends with it (a SIGKILLed launcher left workers training)."""
PRELOAD_FILE = "DTRAIN_PRELOAD_FILE"
PRELOAD_LAUNCHER_PID = "DTRAIN_PRELOAD_LAUNCHER_PID"
PRELOAD_FIRST = "DTRAIN_PRELOAD_FIRST"
SIMULATE_PRELOAD = "DTRAIN_SIMULATE_PRELOAD"
"""The simulator's and the model's modules, ``,``-separated, for the simulated ranks' fork
server to import (set while it starts: simulate/run.py -> simulate/server_preload.py)."""
WARM_POOL = "DTRAIN_WARM_POOL"
"""``0`` (or ``off``): no warm worker pool; each launch starts its own fork server."""
WARM_POOL_IDLE_S = "DTRAIN_WARM_POOL_IDLE_S"
"""Seconds a warm pool waits for the next launch before it ends (default 600)."""
WARM_POOL_DIR = "DTRAIN_WARM_POOL_DIR"
"""Where the pools' sockets live (default ``<tmp>/dtrain-pool-<uid>``; tests use their own)."""
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
"""torch's agent: this worker group's restart attempt (0 the first time)."""
SCHEDULER_JOB = ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST")
"""Set inside a SLURM job / a Kubernetes pod (the kubelet sets it in every container)."""
SLURM_NODE_ID = "SLURM_NODEID"


# -- the launch ----------------------------------------------------------------------------
def mark_launch_start(env: MutableMapping[str, str] | None = None, *, now: bool = False) -> None:
    """The launch command's first act: keep an earlier command's start (``dtrain run`` of
    ``--validate-cluster`` then the script) unless ``now``; ``env``: a child's environment."""
    target = os.environ if env is None else env
    if env is None:  # this process launches: its workers (through its fork server) end with it
        os.environ[LAUNCHER_PID] = str(os.getpid())
    if now:
        target[LAUNCH_T0] = repr(time.time())
    else:
        target.setdefault(LAUNCH_T0, repr(time.time()))


def launch_started_at() -> float:
    """Epoch seconds of the launch command's start; nan when not started by one."""
    try:
        return float(os.environ.get(LAUNCH_T0, "nan"))
    except ValueError:
        return float("nan")


def launcher_pid() -> int | None:
    try:
        return int(os.environ[LAUNCHER_PID])
    except (KeyError, ValueError):
        return None


def restart_count() -> int:
    """torch elastic's restart attempt of this worker group (0 outside the agent)."""
    try:
        return int(os.environ.get(RESTART_COUNT, "0"))
    except ValueError:
        return 0


# -- the worker's run dir and your script's files -------------------------------------------
def set_run_dir(path: Path) -> None:
    os.environ[RUN_DIR] = str(path)


def run_dir() -> Path | None:
    value = os.environ.get(RUN_DIR)
    return Path(value) if value else None


def set_script_files(run: Path, plan: Path, config: Path) -> None:
    """``dtrain run``: where your script finds the run (:mod:`dtrain_cli.script_env`)."""
    os.environ.update({RUN_DIR: str(run), PLAN: str(plan), CONFIG: str(config)})


def plan_file() -> Path | None:
    value = os.environ.get(PLAN)
    return Path(value) if value else None


# -- user settings ----------------------------------------------------------------------------
def cache_root() -> Path | None:
    value = os.environ.get(CACHE)
    return Path(value) if value else None


def config_path() -> list[str]:
    return [p for p in os.environ.get(CONFIG_PATH, "").split(os.pathsep) if p]


def fault_spec() -> str:
    return os.environ.get(FAULTS, "")


def validate_hang_rank() -> int | None:
    value = os.environ.get(VALIDATE_HANG_RANK, "")
    return int(value) if value.lstrip("-").isdigit() else None


def simulate_preload() -> list[str]:
    return [name for name in os.environ.get(SIMULATE_PRELOAD, "").split(",") if name]


# -- the fork server's hand-off (launch/worker_server.py -> launch/server_preload.py) --------
def set_preload(file: str, launcher_pid: int, first: list[str] | tuple[str, ...]) -> None:
    os.environ.update(
        {
            PRELOAD_FILE: file,
            PRELOAD_LAUNCHER_PID: str(launcher_pid),
            PRELOAD_FIRST: ",".join(first),
        }
    )


def preload_pending() -> bool:
    return PRELOAD_FILE in os.environ or PRELOAD_FIRST in os.environ


def clear_preload() -> None:
    for key in (PRELOAD_FILE, PRELOAD_LAUNCHER_PID, PRELOAD_FIRST):
        os.environ.pop(key, None)


def take_preload(default_first: tuple[str, ...]) -> tuple[str | None, int, list[str]]:
    """(file, launcher pid, first imports), removed from the environment: the workers the
    server forks must not inherit them."""
    file = os.environ.pop(PRELOAD_FILE, None)
    pid = int(os.environ.pop(PRELOAD_LAUNCHER_PID, "0") or 0)
    first = os.environ.pop(PRELOAD_FIRST, ",".join(default_first)).split(",")
    return file, pid, [name for name in first if name]


def warm_pool_wanted() -> bool:
    return os.environ.get(WARM_POOL, "1").strip().lower() not in ("0", "off", "false", "no")


def warm_pool_dir() -> str | None:
    return os.environ.get(WARM_POOL_DIR) or None


def warm_pool_idle_s() -> float:
    try:
        return float(os.environ.get(WARM_POOL_IDLE_S, "600"))
    except ValueError:
        return 600.0


# -- the scheduler ----------------------------------------------------------------------------
def in_scheduler_job() -> bool:
    """Inside a SLURM job or a Kubernetes pod (where SIGTERM means preemption)."""
    return any(key in os.environ for key in SCHEDULER_JOB)


def scheduler_node_rank() -> int | None:
    """SLURM's node id of this node within the job (``dtrain agent``'s default rank)."""
    value = os.environ.get(SLURM_NODE_ID, "")
    return int(value) if value.isdigit() else None
