"""``dtrain validate-cluster``'s static checks: this node's environment against the request.

    dtrain validate-cluster --nnodes 2 --rdzv-endpoint host0:29500

Each check is pass / warn / fail with the fix. The checks are pure functions of a
:class:`Request` and the :class:`Facts` gathered from the machine (tests pass made-up
facts); :func:`gather_facts` is the only part that looks at the machine. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dtrain_cli.launch.host_facts import (
    dir_writable,
    expand_nodelist,
    is_loopback,
    local_addresses,
    port_is_free,
    resolve_host,
)
from dtrain_cli.launch.multinode import parse_endpoint

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Request:
    nnodes: int = 1
    nproc_per_node: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str = "127.0.0.1:0"
    backend: str = "gloo"
    run_dir: Path = Path("runs")
    single_host: bool = False
    """All nodes are processes on this machine (tests): a loopback endpoint only warns."""


@dataclass
class Facts:
    env: Mapping[str, str]
    torch_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    num_gpus: int = 0
    num_cpus: int = 1
    which: Callable[[str], str | None] = shutil.which
    resolve: Callable[[str], list[str]] = field(default=lambda host: resolve_host(host))
    local_addresses: set[str] = field(default_factory=set)
    port_free: Callable[[int], bool] = field(default=lambda port: port_is_free(port))
    writable: Callable[[Path], str | None] = field(default=lambda p: dir_writable(p))


def gather_facts(env: Mapping[str, str] | None = None, with_torch: bool = True) -> Facts:
    """What this machine has. ``with_torch`` imports torch for its versions and devices."""
    facts = Facts(env=dict(os.environ if env is None else env))
    facts.num_cpus = len(os.sched_getaffinity(0))
    facts.local_addresses = local_addresses()
    if with_torch:
        import torch

        facts.torch_version = torch.__version__
        facts.cuda_version = torch.version.cuda
        if torch.cuda.is_available():
            facts.num_gpus = torch.cuda.device_count()
            with contextlib.suppress(Exception):
                facts.nccl_version = ".".join(map(str, torch.cuda.nccl.version()))
    return facts


def static_checks(req: Request, facts: Facts) -> list[Check]:
    checks = [_versions(req, facts), _devices(req, facts)]
    checks += _torch_env(req, facts)
    checks += _slurm_env(req, facts)
    checks += _rendezvous(req, facts)
    checks.append(_run_dir(req, facts))
    return checks


def _versions(req: Request, f: Facts) -> Check:
    detail = f"torch {f.torch_version or '?'}, CUDA {f.cuda_version or '-'}, NCCL "
    detail += f.nccl_version or "-"
    if req.backend == "nccl" and not f.num_gpus:
        return Check(
            "torch / CUDA / NCCL",
            FAIL,
            detail + ": backend nccl needs CUDA GPUs",
            "run on a GPU node, or --backend gloo",
        )
    return Check("torch / CUDA / NCCL", PASS, detail + f", backend {req.backend}")


def _devices(req: Request, f: Facts) -> Check:
    n = req.nproc_per_node
    if req.backend == "nccl":
        if f.num_gpus < n:
            return Check(
                "devices",
                FAIL,
                f"{n} processes per node but {f.num_gpus} GPUs visible",
                f"request {n} GPUs per node (--gpus-per-node), check CUDA_VISIBLE_DEVICES, "
                f"or use --nproc-per-node {f.num_gpus}",
            )
        return Check("devices", PASS, f"{f.num_gpus} GPUs visible for {n} processes per node")
    if n > f.num_cpus:
        return Check(
            "devices",
            WARN,
            f"{n} CPU processes per node on {f.num_cpus} cores (oversubscribed: slow collectives)",
            f"--nproc-per-node {f.num_cpus} or more CPUs (--cpus-per-task)",
        )
    return Check("devices", PASS, f"cpu: {n} processes per node on {f.num_cpus} cores")


def _torch_env(req: Request, f: Facts) -> list[Check]:
    env = f.env
    keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    found = {k: env[k] for k in keys if k in env}
    if not found:
        return [Check("MASTER_ADDR/RANK/WORLD_SIZE", PASS, "not set (the launcher sets them)")]
    out = []
    fix_unset = "unset it: dtrain's launcher sets these for every worker"
    if "MASTER_ADDR" in found and not f.resolve(found["MASTER_ADDR"]):
        out.append(
            Check(
                "MASTER_ADDR",
                FAIL,
                f"MASTER_ADDR={found['MASTER_ADDR']} does not resolve",
                "use node 0's host name or IP (getent hosts NAME must answer), or " + fix_unset,
            )
        )
    ints: dict[str, int] = {}
    for k in ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if k in found:
            if found[k].isdigit():
                ints[k] = int(found[k])
            else:
                out.append(Check(k, FAIL, f"{k}={found[k]} is not a number", fix_unset))
    if "MASTER_PORT" in ints and not 0 < ints["MASTER_PORT"] < 65536:
        out.append(Check("MASTER_PORT", FAIL, f"MASTER_PORT={ints['MASTER_PORT']}", "1..65535"))
    world = req.nnodes * req.nproc_per_node
    if "WORLD_SIZE" in ints and ints["WORLD_SIZE"] != world:
        out.append(
            Check(
                "WORLD_SIZE",
                FAIL,
                f"WORLD_SIZE={ints['WORLD_SIZE']} but {req.nnodes} node(s) x "
                f"{req.nproc_per_node} process(es) = {world} were requested",
                f"--nnodes/--nproc-per-node to match, or {fix_unset}",
            )
        )
    if "RANK" in ints and "WORLD_SIZE" in ints and ints["RANK"] >= ints["WORLD_SIZE"]:
        out.append(
            Check(
                "RANK", FAIL, f"RANK={ints['RANK']} >= WORLD_SIZE={ints['WORLD_SIZE']}", fix_unset
            )
        )
    if "LOCAL_RANK" in ints and ints["LOCAL_RANK"] >= req.nproc_per_node:
        out.append(
            Check(
                "LOCAL_RANK",
                FAIL,
                f"LOCAL_RANK={ints['LOCAL_RANK']} >= {req.nproc_per_node} processes per node",
                fix_unset,
            )
        )
    if not out:
        shown = " ".join(f"{k}={v}" for k, v in found.items())
        out.append(Check("MASTER_ADDR/RANK/WORLD_SIZE", PASS, f"consistent: {shown}"))
    return out


def _slurm_env(req: Request, f: Facts) -> list[Check]:
    env = f.env
    if "SLURM_JOB_ID" not in env and "SLURM_NTASKS" not in env:
        return [Check("SLURM", PASS, "not in a SLURM job")]
    out = []
    if "SLURM_JOB_ID" in env and not f.which("scontrol"):
        out.append(
            Check(
                "scontrol",
                FAIL,
                "in SLURM job but `scontrol` is not on PATH (needed for the node list, requeue)",
                "add SLURM's bin directory to PATH (e.g. /usr/bin) in cluster.setup",
            )
        )
    nnodes_env = env.get("SLURM_NNODES", "")
    if nnodes_env.isdigit() and int(nnodes_env) != req.nnodes:
        out.append(
            Check(
                "SLURM_NNODES",
                FAIL,
                f"SLURM_NNODES={nnodes_env} but --nnodes {req.nnodes}",
                f"--nnodes {nnodes_env}, or allocate {req.nnodes} nodes (#SBATCH --nodes)",
            )
        )
    out += [c for c in (_slurm_ntasks(req, env), _slurm_nodelist(f, nnodes_env)) if c]
    if not out:
        out.append(Check("SLURM", PASS, f"job {env.get('SLURM_JOB_ID', '?')} consistent"))
    return out


def _slurm_ntasks(req: Request, env: Mapping[str, str]) -> Check | None:
    """WORLD_SIZE set beside SLURM_NTASKS must mean one task per rank or per node."""
    ntasks, world = env.get("SLURM_NTASKS", ""), env.get("WORLD_SIZE", "")
    if not (ntasks.isdigit() and world.isdigit()):
        return None
    per_task = int(ntasks) == int(world)  # one task per rank (srun-per-rank)
    per_node = int(ntasks) * req.nproc_per_node == int(world)  # one launcher per node
    if per_task or per_node:
        return None
    return Check(
        "SLURM_NTASKS",
        FAIL,
        f"WORLD_SIZE={world} but SLURM_NTASKS={ntasks}: neither one task per rank "
        f"nor {ntasks} task(s) x {req.nproc_per_node} process(es)",
        "let dtrain set WORLD_SIZE (unset it), or fix --ntasks/--nproc-per-node",
    )


def _slurm_nodelist(f: Facts, nnodes_env: str) -> Check | None:
    """Every host of the job's node list resolves, and there are SLURM_NNODES of them."""
    nodelist = f.env.get("SLURM_JOB_NODELIST") or f.env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    hosts = expand_nodelist(nodelist)
    bad = [h for h in hosts if not f.resolve(h)]
    if bad:
        return Check(
            "SLURM_JOB_NODELIST",
            FAIL,
            f"{nodelist} -> {len(hosts)} host(s); not resolvable: {', '.join(bad)}",
            "fix DNS or /etc/hosts on this node for those names",
        )
    if nnodes_env.isdigit() and len(hosts) != int(nnodes_env):
        return Check(
            "SLURM_JOB_NODELIST",
            FAIL,
            f"{nodelist} lists {len(hosts)} host(s) but SLURM_NNODES={nnodes_env}",
            "the job's environment is inconsistent: resubmit",
        )
    return Check("SLURM_JOB_NODELIST", PASS, f"{nodelist} -> {', '.join(hosts)}")


def _rendezvous(req: Request, f: Facts) -> list[Check]:
    parsed = parse_endpoint(req.rdzv_endpoint)
    if parsed is None:
        return [
            Check(
                "rendezvous endpoint",
                FAIL,
                f"{req.rdzv_endpoint!r} is not host:port",
                "--rdzv-endpoint node0:29500",
            )
        ]
    host, port = parsed
    addrs = f.resolve(host)
    if not addrs:
        return [
            Check(
                "rendezvous host",
                FAIL,
                f"{host} does not resolve",
                "use node 0's host name or IP as it resolves on every node",
            )
        ]
    loop = all(is_loopback(a) for a in addrs)
    hosts_here = loop or bool(set(addrs) & f.local_addresses)
    return [_rendezvous_host(req, f, host, addrs), _rendezvous_port(req, f, host, port, hosts_here)]


def _rendezvous_host(req: Request, f: Facts, host: str, addrs: list[str]) -> Check:
    """A loopback rendezvous host is right only where every node runs on this machine."""
    if req.nnodes <= 1 or not all(is_loopback(a) for a in addrs):
        return Check("rendezvous host", PASS, f"{host} -> {', '.join(addrs)}")
    nodelist = f.env.get("SLURM_JOB_NODELIST", "")
    all_here = bool(nodelist) and all(
        all(is_loopback(a) for a in f.resolve(h)) for h in expand_nodelist(nodelist)
    )
    if all_here or req.single_host:
        return Check(
            "rendezvous host",
            WARN if req.single_host and not all_here else PASS,
            f"{host} -> {', '.join(addrs)} (loopback): all {req.nnodes} nodes must "
            "run on this machine",
        )
    return Check(
        "rendezvous host",
        FAIL,
        f"{host} -> {', '.join(addrs)} is a loopback address but nnodes="
        f"{req.nnodes}: each node would rendezvous with itself and hang",
        "use node 0's real host name or IP in --rdzv-endpoint (in SLURM: the "
        "first host of `scontrol show hostnames $SLURM_JOB_NODELIST`); if every node runs "
        'on this machine (two "nodes" in two shells), add --single-host',
    )


def _rendezvous_port(req: Request, f: Facts, host: str, port: int, hosts_here: bool) -> Check:
    """The port is checked where node 0 will open it: on this machine."""
    if port == 0:
        return Check("rendezvous port", PASS, "0: a free port is picked (single node)")
    if not (hosts_here and req.node_rank in (None, 0)):
        return Check("rendezvous port", PASS, f"{port} on {host} (node 0 opens it)")
    if f.port_free(port):
        return Check("rendezvous port", PASS, f"{port} is free on this machine")
    twice = " (another node of this run started here as node 0 too?)" if req.nnodes > 1 else ""
    return Check(
        "rendezvous port",
        FAIL,
        f"port {port} is already in use on this machine ({host}){twice}",
        f"pick another port in --rdzv-endpoint, or stop what holds it (ss -ltnp | grep :{port})",
    )


def _run_dir(req: Request, f: Facts) -> Check:
    reason = f.writable(req.run_dir)
    if reason:
        return Check(
            "run directory",
            FAIL,
            f"{req.run_dir}: not writable ({reason})",
            "use a writable run.root / --run-dir on a file system every node mounts",
        )
    shared = " (shared between nodes: checked live)" if req.nnodes > 1 else ""
    return Check("run directory", PASS, f"{req.run_dir} writable{shared}")
