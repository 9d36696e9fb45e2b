"""``dtrain env``: what to paste into a bug report.

dtrain env          # versions, devices, backends, the env vars that change distributed runs
dtrain env --json
"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

import typer

from dtrain_cli import __version__
from dtrain_cli.cli.common import console

PACKAGES = ("torch", "hydra-core", "omegaconf", "typer", "numpy", "matplotlib")
# What model=hf / data=hf and export need: named even when absent ("not installed")
HF_PACKAGES = ("transformers", "datasets", "tokenizers", "safetensors")
ENV_PREFIXES = (
    "MASTER_",
    "TORCHELASTIC_",
    "TORCH_DISTRIBUTED_",
    "TORCH_NCCL_",
    "NCCL_",
    "GLOO_",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "SLURM_JOB_ID",
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_STEP_",
    "DTRAIN_",
)
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _version(name: str) -> str | None:
    from importlib import metadata  # here, not at import: `dtrain --help` lists this command

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_lines(packages: dict[str, str | None]) -> list[str]:
    """The core packages that are installed; the Hugging Face ones always, each with its
    version or "not installed" (a model=hf run needs them)."""
    core = "  ".join(f"{k} {v}" for k, v in packages.items() if v and k not in HF_PACKAGES)
    hf = "  ".join(f"{k} {packages.get(k) or 'not installed'}" for k in HF_PACKAGES)
    return [core, hf]


def environment() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "dtrain": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in (*PACKAGES, *HF_PACKAGES)},
        "torch_cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "cpus": os.cpu_count(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "backends": {
            name: bool(getattr(dist, f"is_{name}_available", lambda: False)())
            for name in ("gloo", "nccl", "mpi", "ucc", "xccl")
        },
        "env": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
        },
    }
    return info


def env(
    as_json: bool = typer.Option(False, "--json", help="One JSON object."),
) -> None:
    """Versions, devices, backends and distributed env vars, as one pasteable block.

    Guide: docs/debugging.md
    """
    info = environment()
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    backends = " ".join(k for k, ok in info["backends"].items() if ok) or "none"
    devices = ", ".join(info["cuda_devices"]) or "no CUDA devices"
    lines = [
        f"dtrain {info['dtrain']}  python {info['python']}  {info['platform']}",
        *package_lines(info["packages"]),
        f"CUDA {info['torch_cuda'] or '-'}  NCCL {info['nccl'] or '-'}  {info['cpus']} CPUs; "
        f"{devices}",
        f"distributed backends: {backends}",
        "env: " + (" ".join(f"{k}={v}" for k, v in info["env"].items()) or "(none set)"),
    ]
    console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)
