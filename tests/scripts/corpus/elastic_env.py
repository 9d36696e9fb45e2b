"""Reads what torchrun's elastic agent sets (a launcher-aware project's shape).

torchrun --nproc-per-node 2 elastic_env.py out
"""

import os
import sys

import torch.distributed as dist
from report import write

local_world = int(os.environ["LOCAL_WORLD_SIZE"])
group_rank = int(os.environ["GROUP_RANK"])
restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
max_restarts = int(os.environ["TORCHELASTIC_MAX_RESTARTS"])
run_id = os.environ["TORCHELASTIC_RUN_ID"]
dist.init_process_group("gloo")
assert dist.get_world_size() == local_world * int(os.environ["GROUP_WORLD_SIZE"])
write(
    sys.argv[1],
    None,
    node=group_rank,
    restarts=restarts,
    max_restarts=max_restarts,
    has_run_id=bool(run_id),
)
dist.destroy_process_group()
