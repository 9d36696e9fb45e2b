"""``dtrain validate-cluster``'s live check, run in every worker by the elastic agent.

    dtrain validate-cluster                 # this machine, one process per core (max 2)
    dtrain validate-cluster --nnodes 2 --rdzv-endpoint host0:29500   # on every node

1. Arrival: every rank writes ``arrive/<rank>`` into the agent's store; rank 0 waits up to
   the timeout and names the ranks that did not arrive (a hang becomes a failure).
2. Correctness on known values: all_reduce (sum of rank+1), all_gather (ranks), broadcast
   (from the last rank), barrier; and, with a run dir, that a file rank 0 wrote there is
   visible on every rank (a shared file system across nodes).
3. all_reduce latency and bandwidth per message size (busbw = algbw * 2(n-1)/n, as
   nccl-tests report it), the slowest rank's time.

The first failing collective stops the check on that rank (the others then time out on
their next collective instead of hanging). Rank 0 returns the whole report.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dtrain_cli.rundir import env


def _store(timeout: timedelta) -> dist.Store:
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"dtrain-validate/attempt_{env.restart_count()}", store)


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def arrival(store: dist.Store, rank: int, world: int, timeout_s: float) -> list[int]:
    """Ranks that did not arrive within ``timeout_s`` (rank 0 decides, everyone learns)."""
    store.set(f"arrive/{rank}", socket.gethostname())
    if rank == 0:
        deadline = time.monotonic() + timeout_s
        missing = list(range(world))
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([f"arrive/{r}"])]
            if missing:
                time.sleep(0.05)
        store.set("arrival", ",".join(map(str, missing)) or "-")
    store.wait(["arrival"], timedelta(seconds=timeout_s + 30))
    text = store.get("arrival").decode()
    return [] if text == "-" else [int(r) for r in text.split(",")]


def _check(name: str, ok: bool, detail: str, fix: str = "") -> dict[str, str]:
    return {"name": name, "status": "pass" if ok else "fail", "detail": detail, "fix": fix}


def correctness(rank: int, world: int, device: torch.device, run_dir: str | None, token: str):
    """Yields one check per collective; stops at the first that raises."""
    x = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(x)
    want = world * (world + 1) / 2
    yield _check("all_reduce", bool((x == want).all()), f"sum of rank+1 = {x[0].item():g}")
    parts = [torch.empty(4, device=device) for _ in range(world)]
    dist.all_gather(parts, torch.full((4,), float(rank), device=device))
    got = [int(p[0].item()) for p in parts]
    ok = got == list(range(world)) and all(bool((p == p[0]).all()) for p in parts)
    yield _check("all_gather", ok, f"ranks gathered: {got}")
    b = torch.full((8,), 1000.0 + rank, device=device)
    dist.broadcast(b, src=world - 1)
    ok = bool((b == 1000.0 + world - 1).all())
    yield _check("broadcast", ok, f"from rank {world - 1}: {b[0].item():g}")
    t0 = time.perf_counter()
    dist.barrier()
    yield _check("barrier", True, f"{1e3 * (time.perf_counter() - t0):.2f} ms")
    if run_dir:
        probe = Path(run_dir) / f".validate-{token}"
        if rank == 0:
            probe.write_text(token)
        dist.barrier()
        try:
            seen = probe.read_text() == token
        except OSError:
            seen = False
        flags = torch.tensor([0.0 if seen else 1.0], device=device)
        blind = [torch.zeros(1, device=device) for _ in range(world)]
        dist.all_gather(blind, flags)
        missing = [r for r, f in enumerate(blind) if f.item() > 0]
        dist.barrier()
        if rank == 0:
            probe.unlink(missing_ok=True)
        yield _check(
            "run dir shared",
            not missing,
            f"{run_dir}: seen by all {world} ranks"
            if not missing
            else f"{run_dir}: rank(s) {_ranks_text(missing)} cannot see a file rank 0 wrote",
            "" if not missing else "put run.root on a file system every node mounts (NFS, Lustre)",
        )


def bandwidth(sizes: list[int], world: int, device: torch.device) -> list[dict[str, float]]:
    """all_reduce (sum, float32) per size: latency and algorithm/bus bandwidth."""
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        iters = max(3, min(50, int(2e8 // max(nbytes, 1))))
        for _ in range(2):
            dist.all_reduce(x)
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64).to(device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        sec = float(t.item())
        alg = x.numel() * 4 / sec
        rows.append(
            {
                "bytes": x.numel() * 4,
                "iters": iters,
                "latency_us": sec * 1e6,
                "algbw_GBps": alg / 1e9,
                "busbw_GBps": alg * 2 * (world - 1) / world / 1e9,
            }
        )
    return rows


def check_main(
    backend: str,
    timeout_s: float,
    sizes: list[int],
    run_dir: str | None,
    token: str,
    report_path: str,
    agent_pid: int,
) -> dict[str, Any]:
    """Entry point of every worker (elastic agent, fork start). Rank 0 returns the report
    and writes it to ``report_path`` (read by the CLI when the agent had to be stopped)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    timeout = timedelta(seconds=timeout_s)
    report: dict[str, Any] = {"rank": rank, "world_size": world, "checks": [], "bandwidth": []}
    store = _store(timeout)
    if env.validate_hang_rank() == rank:  # a drill: this rank never arrives
        time.sleep(timeout_s + 60)  # never arrives; the agent ends this process
    missing = arrival(store, rank, world, timeout_s)
    report["checks"].append(_arrival_check(missing, world, timeout_s))
    if missing:
        # A missing rank may hang forever and the agent waits for all of its workers:
        # write the verdict, then stop this node's agent (it ends every worker).
        if rank == 0:
            _write(report_path, report)
        if local_rank == 0:
            os.kill(agent_pid, signal.SIGTERM)
        return report
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world, timeout=timeout
    )
    try:
        _collectives(report, rank, world, device, sizes, run_dir, token)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        _write(report_path, report)
    return report


def _arrival_check(missing: list[int], world: int, timeout_s: float) -> dict[str, Any]:
    if not missing:
        return _check("rendezvous", True, f"all {world} ranks arrived", "")
    return _check(
        "rendezvous",
        False,
        f"rank(s) {_ranks_text(missing)} of {world} did not arrive within {timeout_s:g} s",
        "look at those ranks' node: process started? same --rdzv-endpoint and id?",
    )


def _collectives(
    report: dict[str, Any],
    rank: int,
    world: int,
    device: torch.device,
    sizes: list[int],
    run_dir: str | None,
    token: str,
) -> None:
    """The hosts, the correctness checks and, where they pass, the bandwidth, into
    ``report``; a timed-out or broken collective is reported as a failed check."""
    try:
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        report["hosts"] = hosts
        for check in correctness(rank, world, device, run_dir, token):
            report["checks"].append(check)
        if all(c["status"] == "pass" for c in report["checks"]):
            report["bandwidth"] = bandwidth(sizes, world, device)
    except Exception as exc:  # a timed-out or broken collective: report it, stop here
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        report["checks"].append(
            _check(
                "collectives",
                False,
                f"rank {rank}: {first}",
                "a rank died or the network between nodes blocks the backend's ports "
                "(open them, or set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)",
            )
        )


def _write(path: str, report: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(report))
    os.replace(tmp, path)
