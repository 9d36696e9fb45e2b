"""How a ``dtrain run`` rank ends: its process groups never deadlock it
(:mod:`dtrain_cli.runtime.parallel.group_lifetime`). In-process: threads, no process.
Its output's tee is a process: tests/launch/test_script_tee.py."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch._dynamo  # as the fork server has it (see below)
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dtrain_cli.runtime.parallel import group_lifetime


@pytest.fixture
def one_rank_group(monkeypatch):
    """A one-rank gloo group in this process; torch.distributed as it was afterwards."""
    monkeypatch.setattr(dist, "destroy_process_group", dist.destroy_process_group)
    c10d = dist.distributed_c10d
    monkeypatch.setattr(c10d, "destroy_process_group", c10d.destroy_process_group)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    group_lifetime._kept.clear()


def _gloo_threads() -> int:
    tasks = Path(f"/proc/{os.getpid()}/task")
    return sum((t / "comm").read_text().strip() == "pt_gloo_runloop" for t in tasks.iterdir())


def _settled_gloo_threads() -> int:
    """The count once it holds for 0.2 s: gloo's threads name themselves once running."""
    deadline, last, same = time.monotonic() + 10, -1, 0
    while time.monotonic() < deadline and (same < 20 or last < 1):
        count = _gloo_threads()
        same, last = (same + 1, count) if count == last else (0, count)
        time.sleep(0.01)
    return last


def _train_and_drop_ddp() -> None:
    """pytorch/examples' shape: DDP, backward, destroy_process_group, the model freed at
    the function's end (its reducer held the group's last reference)."""
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    dist.destroy_process_group()


def test_ddp_model_freed_after_destroy_never_destroys_its_group(one_rank_group):
    """The group's destructor joins gloo's threads with the GIL held when DDP's reducer
    drops the last reference; one thread may need the GIL to drop its last allreduce (a
    hang about one run in ten). Kept, the group dies later, from a Python reference whose
    destructor releases the GIL, once its threads are idle. torch._dynamo is imported
    first, as in a forked worker: imported for the first time inside DDP's constructor
    (a fresh interpreter, torchrun), it keeps references to the group, which then never
    dies and never hangs."""
    group_lifetime.install()
    before = _settled_gloo_threads()
    assert before >= 1, "this group's runloop threads"
    _train_and_drop_ddp()  # the installed destroy_process_group
    assert not dist.is_initialized()
    assert _gloo_threads() == before  # the reducer is gone, the group is not
    assert len(group_lifetime.kept_groups()) == 1

    # the next generation lets the previous one go: its threads end, nothing piles up
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    second = dist.group.WORLD
    dist.destroy_process_group()
    deadline = time.monotonic() + 10
    while _gloo_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_lifetime.kept_groups() == [second]
    assert _settled_gloo_threads() == before  # the first group's threads ended, the second's run


def test_install_wraps_once_and_leaves_a_fresh_interpreter_alone(one_rank_group, monkeypatch):
    """Forked workers (torch imported): the script's ``dist.destroy_process_group`` keeps
    groups, installed once however often the worker installs it. A spawn worker has not
    imported torch.distributed: nothing is imported or wrapped there."""
    real = dist.destroy_process_group
    group_lifetime.install()
    group_lifetime.install()
    wrapped = dist.destroy_process_group
    assert wrapped is not real and wrapped.__wrapped__ is real
    assert dist.distributed_c10d.destroy_process_group is wrapped

    monkeypatch.setattr(dist, "destroy_process_group", real)
    monkeypatch.delitem(sys.modules, "torch.distributed")
    group_lifetime.install()
    assert "torch.distributed" not in sys.modules
    assert dist.destroy_process_group is real


@pytest.mark.parametrize(
    ("source", "told"),
    [
        ("import torch.distributed as dist\nprint(os.environ['RANK'])\n", True),
        ("import os\nprint(os.environ['RANK'])\n", False),  # splits files by RANK: meant alone
        # its own processes (the mp.spawn tutorials) join a group this process never sees
        ("import torch.distributed as dist\nimport torch.multiprocessing as mp\n"
         "mp.spawn(main, nprocs=2)\n", False),
        ("import torch.distributed\nfrom multiprocessing import Process\np = Process(target=f)\n",
         False),
    ],
)  # fmt: skip
def test_rank_0_says_a_script_never_joined_unless_its_own_processes_may_have(
    tmp_path, monkeypatch, capsys, source, told
):
    from dtrain_cli.runtime.script import arrival

    script = tmp_path / "train.py"
    script.write_text(source)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(arrival, "_CALLS", [])  # watched, never called
    arrival.say_if_alone(0, str(script))
    said = "warning: the script never called init_process_group: its 2 ranks ran alone"
    assert (said in capsys.readouterr().err) == told
    arrival.say_if_alone(1, str(script))  # rank 0 says it, once
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])  # it printed its help
    arrival.say_if_alone(0, str(script))
    assert capsys.readouterr().err == ""
