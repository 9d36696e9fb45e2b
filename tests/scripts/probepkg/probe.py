"""What a script sees and does under ``dtrain run`` (tests/launch/test_script_run.py).

    dtrain run dp=2 -m probepkg.probe MODE OUT [ARGS...]    # from tests/scripts

Modes: dump (what it was given), raise / exit3 (rank 1 fails), segv / sigkill (rank 1 dies
by a signal after its last lines), kill_once (rank 1 dies on the first attempt), late (rank
1 never calls init_process_group), hang (waits to be stopped, with a child process of its
own), preempt (saves on USR1, exits 75), nccl (asks for NCCL, as a script written for GPUs
does).
"""

import json
import os
import signal
import sys
import time

from dtrain_cli import script_env

from . import helper

MODE, OUT = sys.argv[1], sys.argv[2]
RANK = int(os.environ["RANK"])
os.makedirs(OUT, exist_ok=True)


def write(name: str, data: object) -> None:
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(data, f)


def running_until_stopped() -> None:
    """Rank 0 of raise / exit3: in its script (its log open) when rank 1 fails, so that
    what the launcher's stop leaves in rank 0's log is seen."""
    write("rank_0.running", {})
    time.sleep(120)


def wait_for_rank_0() -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(OUT, "rank_0.running")):
        if time.monotonic() > deadline:
            raise SystemExit("rank 0 never started its script")
        time.sleep(0.05)


if MODE == "dump":
    run = script_env.current()
    write(
        f"rank_{RANK}.json",
        {
            "argv": sys.argv,
            "name": __name__,
            "file": __file__,
            "package": __package__,
            "path0": sys.path[0],
            "helper": helper.VALUE,
            "torch_preloaded": "torch" in sys.modules,
            "world": os.environ["WORLD_SIZE"],
            "global_batch": run.global_batch_size,
            "micro": run.micro_batch_size,
            "accum": run.grad_accum,
            "lrs": [run.lr_at(s) for s in range(run.steps)],
            "coords": run.coords,
            "ckpt_steps": [s for s in range(1, run.steps + 1) if run.should_checkpoint(s)],
            "run_dir": str(run.run_dir),
        },
    )
elif MODE == "raise":
    if RANK == 1:
        wait_for_rank_0()
        print("rank 1 about to fail", flush=True)
        raise ValueError("boom from rank 1")
    running_until_stopped()
elif MODE == "exit3":
    if RANK == 1:
        wait_for_rank_0()
        print("bad data on rank 1", file=sys.stderr, flush=True)
        sys.exit(3)
    running_until_stopped()
elif MODE in ("segv", "sigkill"):  # rank 1 dies by a signal right after its last lines
    if RANK == 1:
        wait_for_rank_0()
        print("rank 1 line 1", flush=True)
        print("rank 1 line 2 on stderr", file=sys.stderr, flush=True)
        if MODE == "segv":  # a C extension's fault: faulthandler's stack, then the death
            import ctypes

            def reads_address_zero() -> None:
                ctypes.string_at(0)

            reads_address_zero()
        os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer's way
    running_until_stopped()
elif MODE == "kill_once":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if restart == 0 and RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1) * (RANK + 1)
    dist.all_reduce(t)
    if RANK == 0:
        write("result.json", {"restart": restart, "sum": t.item()})
    dist.destroy_process_group()
elif MODE == "late":  # rank 1 never reaches init_process_group
    import torch.distributed as dist

    if RANK == 1:
        time.sleep(120)
    dist.init_process_group("gloo")
elif MODE == "nccl":  # a script written for GPUs
    import torch.distributed as dist

    dist.init_process_group(backend="nccl")
elif MODE == "preempt" and os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
    write(f"resumed_rank_{RANK}", {"restart": os.environ["SLURM_RESTART_COUNT"]})
elif MODE == "preempt" and os.path.exists(os.path.join(OUT, f"checkpoint_rank_{RANK}")):
    write(f"resumed_rank_{RANK}", {"run_dir": os.environ["DTRAIN_RUN_DIR"]})  # its checkpoint
elif MODE in ("hang", "preempt"):
    stop = []
    sig = getattr(signal, "SIG" + script_env.current().preemption_signal)
    if MODE == "preempt":
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    if MODE == "hang":  # a child of the script's own, which must not outlive the run
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        write(f"child_rank_{RANK}", child.pid)
    write(f"pid_rank_{RANK}", os.getpid())
    deadline = time.time() + 120
    while not stop and time.time() < deadline:
        time.sleep(0.05)
    if stop:
        write(f"checkpoint_rank_{RANK}", {"saved": True})
        print(f"rank {RANK} saved its checkpoint", flush=True)
        sys.exit(script_env.EXIT_PREEMPTED)
