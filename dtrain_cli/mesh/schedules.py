"""The pipeline schedules of ``torch.distributed.pipelining``, by dtrain name, and what each
needs from a layout. Torch-free (the plan, the strategies and the runtime read them).

    dtrain plan recipe=gpt_small pp=2 pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2
"""

from __future__ import annotations

SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "looped_bfs": "LoopedBFS",
    "interleaved_zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
"""dtrain name -> torch's schedule class name."""
SINGLE_STAGE = frozenset({"gpipe", "1f1b"})
"""One stage per rank."""
V_SHAPED = frozenset({"zbv", "dualpipev"})
"""Exactly two stages per rank, placed in a V."""


def default_virtual_stages(schedule: str) -> int:
    """Stages per rank when ``pipeline.virtual_stages`` is unset: a V takes two, else one."""
    return 2 if schedule in V_SHAPED else 1


SPLIT_BACKWARD = frozenset({"interleaved_zb", "zbv", "dualpipev"})
"""Zero-bubble schedules split backward into input and weight passes and set weight
gradients themselves: DDP's autograd hooks never see them, so dp runs torch's replicate."""
