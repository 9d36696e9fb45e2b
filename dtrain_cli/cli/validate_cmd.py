"""``dtrain validate-cluster``: is this machine (or cluster) ready for a distributed run?

    dtrain validate-cluster                                          # this machine
    dtrain validate-cluster --nnodes 2 --rdzv-endpoint host0:29500   # on every node, or:
    dtrain sbatch --validate nodes=2 --submit                        # as a SLURM job

Static checks (:mod:`dtrain_cli.launch.cluster_env`), then, when none failed, a live check
(:mod:`dtrain_cli.runtime.diagnostics.collective_check`) in as many workers as a run would start,
through the same elastic agent and c10d rendezvous. Exit code 1 on any failure.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from dtrain_cli.cli.common import console, fail, print_whole
from dtrain_cli.rundir import env

STYLE = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]"}
DEFAULT_SIZES = "1K,64K,1M,16M"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B")
    try:
        size = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise ValueError(f"--sizes: {text!r} is not a size (e.g. 1K, 64K, 1M, 64M)") from None
    if size < 4:  # one float32: a smaller all_reduce measured 4 B anyway
        raise ValueError(f"--sizes: {text!r} is below one float (4 B); e.g. 1K, 64K, 1M, 64M")
    return size


def validate_cluster(
    nnodes: int = typer.Option(1, "--nnodes", help="Nodes in the run (run this on each)."),
    nproc_per_node: int | None = typer.Option(
        None, "--nproc-per-node", help="Workers per node; default GPUs, else min(2, cores)."
    ),
    node_rank: int | None = typer.Option(None, "--node-rank", help="Default $SLURM_NODEID."),
    rdzv_endpoint: str | None = typer.Option(
        None, "--rdzv-endpoint", help="host:port of node 0 (default 127.0.0.1:0, one node)."
    ),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Same on every node."),
    backend: str = typer.Option("auto", "--backend", help="auto | gloo | nccl."),
    run_dir: Path = typer.Option(Path("runs"), "--run-dir", help="Must be writable (shared)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds before a hang is a failure."),
    sizes: str = typer.Option(DEFAULT_SIZES, "--sizes", help="all_reduce message sizes."),
    live: bool = typer.Option(True, "--live/--no-live", help="Run the live collective check."),
    single_host: bool = typer.Option(
        False,
        "--single-host",
        help='All nodes run on this machine (two "nodes" in two shells, a test).',
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Check env, devices, ports, SLURM and the run dir; then rendezvous + collectives live.

    Guide: docs/clusters.md
    """
    problems = range_problems(nnodes, nproc_per_node, node_rank, timeout)
    if problems:
        fail(problems)
    try:
        size_list = [parse_size(s) for s in sizes.split(",") if s.strip()]
    except ValueError as exc:
        fail([str(exc)])
    if backend not in ("auto", "gloo", "nccl"):
        fail([f"--backend={backend}: choose one of auto, gloo, nccl"])
    report = check_cluster(
        nnodes,
        nproc_per_node,
        node_rank,
        rdzv_endpoint,
        rdzv_id,
        backend,
        run_dir,
        timeout,
        size_list,
        live,
        single_host,
    )
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        show(report)
    raise typer.Exit(0 if report["ok"] else 1)


def check_cluster(
    nnodes: int,
    nproc_per_node: int | None,
    node_rank: int | None,
    rdzv_endpoint: str | None,
    rdzv_id: str | None,
    backend: str,
    run_dir: Path,
    timeout: float,
    sizes: list[int],
    live: bool = True,
    single_host: bool = False,
) -> dict[str, Any]:
    """Static checks, then (none failed) the live check; the report, ``ok`` included.
    Also what ``dtrain run --validate-cluster`` runs before the script."""
    from dtrain_cli.launch.cluster_env import FAIL, Request, gather_facts, static_checks
    from dtrain_cli.launch.host_facts import missing_dirs, remove_empty

    if node_rank is None:
        node_rank = env.scheduler_node_rank()
    facts = gather_facts()
    if backend == "auto":
        backend = "nccl" if facts.num_gpus else "gloo"
    nproc = nproc_per_node or facts.num_gpus or min(2, facts.num_cpus)
    req = Request(
        nnodes=nnodes,
        nproc_per_node=nproc,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint or "127.0.0.1:0",
        backend=backend,
        run_dir=run_dir.resolve(),
        single_host=single_host,
    )
    checks = [c.to_dict() for c in static_checks(req, facts)]
    report: dict[str, Any] = {"request": {**vars(req), "run_dir": str(req.run_dir)}}
    report["static"] = checks
    if not live:
        report["live"] = None
    elif any(c["status"] == FAIL for c in checks):
        report["live"] = {"skipped": "a static check failed; fix it first", "checks": []}
    else:
        made = missing_dirs(req.run_dir)  # the live check writes its probe file there
        req.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            report["live"] = run_live(req, rdzv_id, timeout, sizes)
        finally:
            remove_empty(made)
    live_checks = (report["live"] or {}).get("checks", [])
    report["ok"] = all(c["status"] != FAIL for c in checks + live_checks)
    return report


def range_problems(
    nnodes: int, nproc_per_node: int | None, node_rank: int | None, timeout: float
) -> list[str]:
    """The flags' ranges, before anything uses them (a negative timeout reached TCPStore)."""
    problems = []
    if nnodes < 1:
        problems.append(f"--nnodes={nnodes}: must be >= 1")
    if nproc_per_node is not None and nproc_per_node < 1:
        problems.append(f"--nproc-per-node={nproc_per_node}: must be >= 1 (or leave it out)")
    if node_rank is not None and nnodes >= 1 and not 0 <= node_rank < nnodes:
        problems.append(f"--node-rank={node_rank}: must be in [0, {nnodes}) for --nnodes {nnodes}")
    if not 0 < timeout <= 86400:  # also nan
        problems.append(f"--timeout={timeout:g}: must be > 0 seconds (at most 86400)")
    return problems


def default_rdzv_id(nnodes: int, endpoint: str) -> str:
    """What every node of a check takes without ``--rdzv-id``: the endpoint they all name (a
    random id each, they never met: the guide's own multi-node command failed after its
    timeout; a SLURM job's id differs between allocations checked together); one node: a
    fresh one."""
    if nnodes == 1:
        return f"dtrain-validate-{uuid.uuid4().hex[:12]}"
    return "dtrain-validate-" + "".join(c if c.isalnum() else "-" for c in endpoint)


def run_live(req: Any, rdzv_id: str | None, timeout: float, sizes: list[int]) -> dict[str, Any]:
    """The collective check in ``nnodes x nproc_per_node`` workers (elastic agent, c10d)."""
    import logging

    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from dtrain_cli.launch.preload import CLUSTER_CHECK_ENTRY, entry_point
    from dtrain_cli.launch.rendezvous_events import name_events_cheaply

    name_events_cheaply()
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    run_id = rdzv_id or default_rdzv_id(req.nnodes, req.rdzv_endpoint)
    tmp = tempfile.mkdtemp(prefix="dtrain-validate-")
    report_path = Path(tmp) / "rank0.json"
    # c10d reads join_timeout ("timeout" is the etcd backend's)
    rdzv_configs: dict[str, Any] = {"join_timeout": max(1, int(timeout))}
    if req.nnodes > 1 and req.node_rank is not None:
        rdzv_configs["is_host"] = req.node_rank == 0
    world = req.nnodes * req.nproc_per_node
    config = LaunchConfig(
        min_nodes=req.nnodes,
        max_nodes=req.nnodes,
        nproc_per_node=req.nproc_per_node,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=req.rdzv_endpoint,
        rdzv_configs=rdzv_configs,
        max_restarts=0,
        monitor_interval=0.1,
        # not fork: forking the agent while its store threads run left a worker stuck
        # before its first store call in ~1 of 4 runs with 4 ranks (forkserver: 0 of 16)
        start_method="forkserver",
        logs_specs=DefaultLogsSpecs(log_dir=str(Path(tmp) / "elastic")),
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = (req.backend, timeout, sizes, str(req.run_dir), run_id, str(report_path), os.getpid())
    try:
        results = elastic_launch(config, entry_point(CLUSTER_CHECK_ENTRY))(*args)
    except SignalException:  # a rank stopped the agent: some rank never arrived
        if report_path.is_file():
            return json.loads(report_path.read_text())
        raise
    except RendezvousError as exc:
        detail = (
            f"{req.nnodes - 1} other node(s) ({world - req.nproc_per_node} of {world} ranks) "
            f"did not arrive at {req.rdzv_endpoint} within {timeout:g} s; only this node's "
            f"{req.nproc_per_node} process(es) came ({type(exc).__name__})"
        )
        fix = "start the same command on every node with the same --rdzv-endpoint and --rdzv-id"
        return {"checks": [{"name": "rendezvous", "status": "fail", "detail": detail, "fix": fix}]}
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        msg = failure.message if isinstance(failure.message, str) else str(failure.message)
        detail = f"rank {rank} died (exit code {failure.exitcode}): {msg.strip()[:300]}"
        return {"checks": [{"name": "workers", "status": "fail", "detail": detail, "fix": ""}]}
    reports = sorted((r for r in results.values() if r), key=lambda r: r["rank"])
    if not reports:
        return {"checks": []}
    return reports[0] if reports[0]["rank"] == 0 else {**reports[0], "note": "see node 0"}


def show(report: dict[str, Any]) -> None:
    table = Table(title="validate-cluster", title_justify="left")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    live = report["live"] or {}
    for c in report["static"] + live.get("checks", []):
        table.add_row(c["name"], STYLE[c["status"]], c["detail"], c.get("fix", ""))
    print_whole(table)
    if live.get("skipped"):
        console.print(f"live check skipped: {live['skipped']}", highlight=False)
    rows = live.get("bandwidth") or []
    if rows:
        bw = Table(title=f"all_reduce, {live['world_size']} ranks", title_justify="left")
        for col in ("size", "latency", "algbw GB/s", "busbw GB/s"):
            bw.add_column(col, justify="right")
        for r in rows:
            bw.add_row(
                _human(r["bytes"]),
                f"{r['latency_us']:.0f} us",
                f"{r['algbw_GBps']:.3f}",
                f"{r['busbw_GBps']:.3f}",
            )
        print_whole(bw)
    verdict = "[green]ok[/]" if report["ok"] else "[bold red]FAILED[/]"
    console.print(f"validate-cluster: {verdict}", highlight=False)


def _human(n: int) -> str:
    for unit, size in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"
