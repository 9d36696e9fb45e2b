"""A rank's peak memory so far, as its start-up left it (logged by every rank, kept in the
summary): the host's resident-set high-water mark (``getrusage``; Linux's ``VmHWM``) and,
on CUDA, the caching allocator's peak (``torch.cuda.max_memory_allocated``).

    grep "start-up peak" runs/<run>/logs/rank_*.log

A forked worker starts from its fork server's resident set (torch imported), so the host
figure is that plus what the start-up built: the model (a pipeline stage only its own
layers), its wrappers and optimizer state.
"""

from __future__ import annotations

import resource
import sys

import torch


def peak_bytes(device: torch.device) -> dict[str, int]:
    """``{"host": bytes}``, and ``"device"`` on CUDA."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"host": int(rss if sys.platform == "darwin" else rss * 1024)}  # macOS: bytes
    if device.type == "cuda":
        out["device"] = int(torch.cuda.max_memory_allocated(device))
    return out


def describe(peak: dict[str, int]) -> str:
    """``host 1.2 GiB, device 30.5 GiB``."""
    return ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in peak.items())
