"""A script that meets at an address of its own under ``dtrain run``.

torchrun tells its workers ``TORCHELASTIC_USE_AGENT_STORE=True``: torch's rendezvous then
connects as a client at whatever address it is given. A script that sets its own
``MASTER_PORT`` (as the DDP tutorials do), and the processes a script starts with
``mp.spawn``, waited there for a store nobody hosts: 30 minutes under torchrun, then a
timeout. dtrain keeps the flag to the rank's own ``init_process_group`` at the agent's port
(dtrain_cli/runtime/script/arrival.py), so such a script meets where it says, as under
plain ``python``. The values are checked: the all-reduce of the ranks' numbers.
"""

from __future__ import annotations

import socket

import pytest

from tests.conftest import run_dtrain

OWN_PORT = """\
import os, sys
import torch
import torch.distributed as dist
os.environ["MASTER_ADDR"] = "localhost"
os.environ["MASTER_PORT"] = sys.argv[1]
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {t.item()}")
dist.destroy_process_group()
"""

TCP_FROM_ENV = """\
import os
import torch
import torch.distributed as dist
url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world)
t = torch.ones(1) * (rank + 1)
dist.all_reduce(t)
print(f"rank {rank} of {world}: sum {t.item()}")
dist.destroy_process_group()
"""

# its own TCPStore at torchrun's address, rank 0 the master (positional or keyword)
OWN_STORE = """\
import os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if sys.argv[1] == "positional":
    store = dist.TCPStore(*where, world, rank == 0, timeout=timedelta(seconds=30))
else:
    store = dist.TCPStore(*where, world_size=world, is_master=rank == 0)
assert isinstance(store, dist.TCPStore)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
t = torch.ones(1) * (rank + 1)
dist.all_reduce(t)
print(f"rank {rank} of {world}: sum {t.item()}")
dist.destroy_process_group()
"""

# the shape of PyTorch's DDP tutorial: the script starts its ranks itself
SPAWNS = """\
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    print(f"child {rank} of {world_size}: sum {t.item()}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2, join=True)
"""


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("source", "own_port"),
    [(OWN_PORT, True), (TCP_FROM_ENV, False)],
    ids=["its-own-master-port", "tcp-at-the-agents-port"],
)
def test_a_script_meets_where_it_says(tmp_path, source, own_port):
    """Its own ``MASTER_PORT`` (rank 0 hosts the store there); ``tcp://`` built from
    torchrun's variables (the agent's store, as before)."""
    (tmp_path / "train.py").write_text(source)
    args = ["run", "dp=2", "launcher.rdzv_timeout_s=30", "--", "train.py"]
    run = run_dtrain([*args, *([_free_port()] if own_port else [])], tmp_path, timeout=150)
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(run.stdout.count(f"rank {r} of 2: sum 3.0") for r in (0, 1)) == [1, 1]


@pytest.mark.multiproc
@pytest.mark.parametrize("form", ["positional", "keywords"])
def test_a_scripts_own_tcpstore_at_master_port_is_a_client_there(tmp_path, form):
    """As under torchrun (whose C++ store takes the port in use for the agent's): rank 0's
    ``TCPStore(..., is_master=True)`` at ``MASTER_PORT`` failed with EADDRINUSE under
    dtrain's fork server, and the error told the user to change the script."""
    (tmp_path / "train.py").write_text(OWN_STORE)
    run = run_dtrain(["run", "dp=2", "--", "train.py", form], tmp_path, timeout=150)
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(run.stdout.count(f"rank {r} of 2: sum 3.0") for r in (0, 1)) == [1, 1]


@pytest.mark.multiproc
def test_a_script_that_spawns_its_own_ranks_runs_as_one_process(tmp_path):
    """What the plan's warning for ``mp.spawn`` tells the user to run; it hung."""
    (tmp_path / "spawns.py").write_text(SPAWNS)
    run = run_dtrain(["run", "--", "spawns.py", _free_port()], tmp_path, timeout=150)
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(run.stdout.count(f"child {r} of 2: sum 3.0") for r in (0, 1)) == [1, 1]
    warned = run_dtrain(["plan", "dp=2", "--", "spawns.py", "1"], tmp_path)
    said = " ".join(warned.stdout.split())  # the plan's warnings: on stdout, wrapped
    assert "starts its own processes (mp.spawn)" in said
    assert "run it as one process (dtrain run -- spawns.py)" in said
