"""Ends the way MODE says, as a script can end (tests/launch/test_script_run.py).

dtrain run dp=1 -- ends.py exit        # sys.exit(): a clean end, exit code 0
"""

import os
import sys

MODE = sys.argv[1]
RANK = int(os.environ["RANK"])
print(f"rank {RANK} ends by {MODE}", flush=True)

if MODE == "exit":
    sys.exit()
elif MODE == "exit0":
    sys.exit(0)
elif MODE == "exit3":
    sys.exit(3)
elif MODE == "message":
    sys.exit("stopping: a message")
elif MODE == "os_exit0":
    os._exit(0)
elif MODE == "raise":
    raise ValueError("ends by an exception")
elif MODE == "interrupt":  # a KeyboardInterrupt raised by the script itself
    raise KeyboardInterrupt
elif MODE == "draws":  # what a rank's random generators give first
    import random

    import numpy as np
    import torch

    print(f"rank {RANK} draws {random.random()} {np.random.rand()} {torch.rand(1).item()}")
elif MODE == "exit3_in_barrier":  # rank 1 leaves while rank 0 waits for it in a collective
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if RANK == 1:
        sys.exit(3)
    dist.barrier()
elif MODE == "lines":  # many short writes from every rank at once
    for i in range(300):
        print(f"[rank {RANK}] line {i:03d} " + "x" * 40)
    print(f"[rank {RANK}] to stderr", file=sys.stderr)
elif MODE == "leave_a_child":  # a helper the script starts and never stops
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(f"child {child.pid}", flush=True)
elif MODE == "wait_in_c":  # rank 0 waits inside C code (a store) for rank 1
    import datetime
    import time

    import torch.distributed as dist

    out = sys.argv[2]
    open(os.path.join(out, f"started_{RANK}"), "w").close()
    if RANK == 1:
        time.sleep(120)
    port = int(os.environ["MASTER_PORT"]) + 1
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=RANK,
        world_size=2,
        timeout=datetime.timedelta(seconds=300),
    )
# "end": falls off its last line
