"""What every corpus script writes at its end: OUT/rank_<k>.json."""

import json
import multiprocessing
import os

import torch

ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMP_NUM_THREADS",
)


def write(out: str, loss: float | None, **extra: object) -> None:
    os.makedirs(out, exist_ok=True)
    rank = int(os.environ["RANK"])
    record = {
        "loss": loss,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "start_method": multiprocessing.get_start_method(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        **extra,
    }
    with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
        json.dump(record, f)
