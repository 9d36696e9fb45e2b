"""What validate-cluster asks of this machine: host names and addresses, free ports,
writable folders (probed without leaving a trace), SLURM's compressed host lists.
Torch-free; :mod:`.cluster_env` turns them into checks."""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path


def resolve_host(host: str) -> list[str]:
    try:
        return sorted({a[4][0] for a in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except (socket.gaierror, UnicodeError):
        return []


def port_is_free(port: int) -> bool:
    """Whether a listener could bind ``port`` as c10d's store does (``SO_REUSEADDR``: a port
    whose last connections are in TIME_WAIT, after a node restarts, is free to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def dir_writable(path: Path) -> str | None:
    """None when a file can be created and removed in ``path``; else the reason. The
    folders made for the probe are removed again: a check leaves nothing behind."""
    made = missing_dirs(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".dtrain-probe-{uuid.uuid4().hex[:8]}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        remove_empty(made)
    return None


def missing_dirs(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first."""
    return [p for p in (path, *path.parents) if not p.exists()]


def remove_empty(dirs: list[Path]) -> None:
    """Remove each of ``dirs`` (deepest first) that is still empty; leave the rest."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


def local_addresses() -> set[str]:
    out = {"127.0.0.1", "::1", "0.0.0.0"}
    for name in {socket.gethostname(), socket.getfqdn()}:
        out.update(resolve_host(name))
    return out


def is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host lists: ``node[1-3,5],gpu-a[01-02]`` -> host names."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.match(r"^(.*?)\[([^\]]*)\](.*)$", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
    return hosts
