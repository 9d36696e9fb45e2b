"""Multi-node ``dtrain launch``: the flags, their checks, and the run dir every node shares.

    # on every node: node 0's address in the endpoint, the same --rdzv-id everywhere
    dtrain launch recipe=gpt_small dp=4 --nnodes 2 --node-rank 0 \
        --rdzv-endpoint host0:29500 --rdzv-id exp1

Each node composes the same config and plan; the run dir is named after the rendezvous id
(``run.name`` defaults to it, and the id to ``run.name``; one node with ``--rdzv-id`` too),
so every node writes to the same folder on a shared file system. The first node to arrive
creates it (``launch.json`` with O_EXCL: no race); the others check that it holds their
config. Torch-free.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dtrain_cli.config.compose import config_to_yaml
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.validate import name_problems
from dtrain_cli.launch.rundir import taken
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.config_keys import flat_keys
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import signal_number


@dataclass
class NodeArgs:
    nnodes: int | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None


def parse_nnodes(text: str | None) -> tuple[tuple[int, int] | None, list[str]]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4): an elastic run on any 1-4 nodes (their
    order and the layout at each count are the plan's checks)."""
    if text is None:
        return None, []
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if 1 <= len(parts) <= 2 else (0, 0)
    except ValueError:
        return None, [f"--nnodes={text}: not a node count; use N or MIN:MAX"]
    if low < 1 or high < 1:
        return None, [f"--nnodes={text}: must be positive node counts, e.g. --nnodes 2 or 1:2"]
    return (low, high), []


def nnodes_override(counts: tuple[int, int] | None) -> list[str]:
    if counts is None:
        return []
    low, high = counts
    return [f"parallel.nnodes={high}" if low == high else f"parallel.nnodes={low}:{high}"]


def parse_endpoint(endpoint: str) -> tuple[str, int] | None:
    """``host:port`` / ``[v6]:port`` -> (host, port); None when malformed."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        return None
    return host.strip("[]"), int(port)


STORE_WAIT_S = 120
"""How long a node other than 0 waits for node 0's rendezvous store to answer: about what
torch's own client takes to give up (a 60 s connect, then one retry)."""


def wait_for_store(
    endpoint: str, timeout_s: float, say: Callable[[str], None], poll_s: float = 0.5
) -> str | None:
    """Wait until something listens at node 0's ``endpoint``; None then, or why not (the
    last connection error) after ``timeout_s``. Asked before torch's agent connects, whose
    client prints C++ stack frames while it retries. Says once that it waits."""
    parsed = parse_endpoint(endpoint)
    if parsed is None:
        return None  # the plan's checks name it; torch's client says the rest
    start, said, error = time.monotonic(), False, "no answer"
    while True:
        try:
            socket.create_connection(parsed, timeout=max(poll_s, 1.0)).close()
            return None
        except OSError as exc:
            error = exc.strerror or str(exc) or type(exc).__name__
        waited = time.monotonic() - start
        if waited >= timeout_s:
            return f"nothing answered there within {timeout_s:g} s ({error})"
        if not said and waited >= 5:
            said = True
            say(f"waiting for node 0's rendezvous store at {endpoint} (up to {timeout_s:g} s)")
        time.sleep(poll_s)


def apply_node_args(cfg: DtrainConfig, args: NodeArgs) -> list[str]:
    """Put the flags into ``cfg.launcher``/``cfg.run``; returns problems (one line each)."""
    problems: list[str] = []
    nnodes = cfg.parallel.nnodes
    try:
        signal_number(cfg.cluster.signal)  # the agent forwards it, workers watch it
    except ValueError as exc:
        problems.append(f"cluster.signal: {exc}")
    if args.rdzv_endpoint is not None:
        if parse_endpoint(args.rdzv_endpoint) is None:
            problems.append(
                f"--rdzv-endpoint={args.rdzv_endpoint}: expected host:port, e.g. node0:29500"
            )
        cfg.launcher.rdzv_endpoint = args.rdzv_endpoint
    if args.rdzv_id is not None:
        cfg.launcher.rdzv_id = args.rdzv_id
        problems += name_problems("--rdzv-id", args.rdzv_id)  # it names the run dir
        cfg.run.name = cfg.run.name or args.rdzv_id  # on one node as on many
    if args.node_rank is not None and not 0 <= args.node_rank < nnodes:
        problems.append(
            f"--node-rank={args.node_rank}: must be in [0, {nnodes}) for --nnodes {nnodes}"
        )
    if nnodes > 1:
        parsed = parse_endpoint(cfg.launcher.rdzv_endpoint)
        if parsed is None or parsed[1] == 0:
            given = args.rdzv_endpoint is not None
            problems.append(
                (f"--rdzv-endpoint={args.rdzv_endpoint}: " if given else f"nnodes={nnodes}: ")
                + f"{nnodes} nodes need a fixed host:port they all reach: node 0's address, "
                "the same on every node (e.g. --rdzv-endpoint node0:29500)"
            )
        cfg.launcher.rdzv_id = cfg.launcher.rdzv_id or cfg.run.name
        cfg.run.name = cfg.run.name or cfg.launcher.rdzv_id
        if not cfg.launcher.rdzv_id:
            problems.append(
                f"nnodes={nnodes}: every node must name the same run; pass the same "
                "--rdzv-id ID (or run.name=NAME) on every node"
            )
    return problems


def join_run_dir(cfg: DtrainConfig, plan: Plan, wait_s: float = 60.0) -> Path:
    """The run dir all nodes of one multi-node launch share. The first node creates it
    (``launch.json`` created with O_EXCL decides who), the others wait for its
    ``plan.yaml`` and check it matches theirs. Raises FileExistsError / ValueError."""
    run = RunDir((Path(cfg.run.root) / str(cfg.run.name)).resolve())
    run.logs.mkdir(parents=True, exist_ok=True)
    marker = {"rdzv_id": cfg.launcher.rdzv_id, "nnodes": plan.nnodes}
    config_text = config_to_yaml(cfg)
    try:
        fd = os.open(run.launch_record, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return _check_joined(run, marker, config_text, wait_s)
    if run.plan.exists():  # a run from before multi-node launches wrote one
        os.close(fd)
        raise FileExistsError(taken(run))
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(marker))
    tmp = run.config.with_name(".config.yaml.tmp")
    tmp.write_text(config_text)
    tmp.replace(run.config)
    tmp = run.plan.with_name(".plan.yaml.tmp")
    plan.save(tmp)
    tmp.replace(run.plan)
    return run.path


def _check_joined(run: RunDir, marker: dict, config_text: str, wait_s: float) -> Path:
    deadline = time.monotonic() + wait_s
    while not run.plan.exists():
        if time.monotonic() > deadline:
            raise FileExistsError(
                f"{run.path}: another node started this run but wrote no {run.plan.name}"
            )
        time.sleep(0.05)
    theirs = json.loads(run.launch_record.read_text() or "{}")
    if theirs.get("rdzv_id") == marker["rdzv_id"] and theirs.get("nnodes") != marker["nnodes"]:
        raise ValueError(
            f"--nnodes {marker['nnodes']}: this run was started with --nnodes "
            f"{theirs.get('nnodes')} ({run.launch_record}); start every node with the same "
            "--nnodes"
        )
    if theirs != marker:
        raise FileExistsError(
            f"{run.path} already holds a run (rendezvous id {theirs.get('rdzv_id')!r}); "
            "choose another run.name/--rdzv-id"
        )
    if (their_config := run.config.read_text()) != config_text:
        where = _first_difference(their_config, config_text, ignore=MAY_DIFFER)
        if where is not None:
            raise ValueError(
                f"{run.config} differs from this node's config{where}: every node must run "
                "the same recipe, overrides and script arguments"
            )
    if run.summary.exists() or run.finished.exists():  # it ran no step: summary.json emptied
        raise FileExistsError(
            f"{run.path} already holds a run, which finished; choose another --rdzv-id (or "
            "run.name)"
        )
    return run.path


MAY_DIFFER = ("launcher.rdzv_endpoint",)
"""What a node may start with otherwise: the run restarted on another host or port (a
requeue's node 0 elsewhere, a port still in TIME_WAIT)."""


def _first_difference(theirs: str, ours: str, ignore: tuple[str, ...] = ()) -> str | None:
    """`` (script.args: [...] there, [...] here)``: the first key whose values differ; None
    when only keys of ``ignore`` do."""
    import yaml

    try:
        a, b = flat_keys(yaml.safe_load(theirs)), flat_keys(yaml.safe_load(ours))
    except yaml.YAMLError:
        return ""
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key) and key not in ignore:
            return f" ({key}: {a.get(key)!r} there, {b.get(key)!r} here)"
    return None
