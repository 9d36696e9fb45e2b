"""What SLURM says of a job just submitted: a job that asks more than its partition allows
is accepted and then waits forever (``PENDING PartitionNodeLimit``), which ``dtrain sbatch
--submit`` says at once instead. Torch-free.

    dtrain sbatch recipe=gpt_small nodes=4 dp=4 --submit    # a 2-node partition
    warning: job 7 waits with reason PartitionNodeLimit ...; it may never start as asked

Reasons from squeue(1) "JOB REASON CODES" that say the request is outside the partition's,
association's or QOS's limits; PartitionNodeLimit and PartitionConfig may also mean nodes
that are down or drained, which can come back: the warning says "may".
"""

from __future__ import annotations

import re
import subprocess
import time

NEVER_STARTS = {
    "PartitionNodeLimit": "more nodes than the partition has or allows, or some are down",
    "PartitionTimeLimit": "the job's time is over the partition's limit",
    "PartitionConfig": "the partition cannot give what the job asks now",
    "BadConstraints": "no node has the constraints, GPUs or CPUs asked for",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
}
LIMIT = re.compile(r"^(Assoc|QOS)Max\w*PerJob\w*$|^(Assoc|QOS)MaxWallDuration\w*$")
"""An association's or QOS's per-job limit (nodes, CPUs, GRES, wall time)."""


def stuck_reason(job_id: str, polls: int = 4, interval_s: float = 0.4) -> str | None:
    """``REASON: what it means`` when the job waits for what will not come; None when it
    runs, waits for resources or priority, or squeue cannot say. At most ~1.6 s: SLURM
    gives the reason at submit time (PartitionConfig, then PartitionNodeLimit)."""
    reason = None
    for i in range(polls):
        try:
            out = subprocess.run(
                ["squeue", "-h", "-j", job_id, "-o", "%T %r"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        state, _, reason = out.stdout.strip().partition(" ")
        if out.returncode != 0 or state != "PENDING":
            return None
        if i < polls - 1:
            time.sleep(interval_s)
    if reason in NEVER_STARTS:
        return f"{reason}: {NEVER_STARTS[reason]}"
    if reason and LIMIT.match(reason):
        return f"{reason}: over a per-job limit of the account or QOS"
    return None
