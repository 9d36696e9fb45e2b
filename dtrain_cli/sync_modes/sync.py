"""``sync.mode=sync`` (default): replicas synchronize every step through the strategy's own
communication (DDP's all-reduce, FSDP's reduce-scatter). Runtime half: nothing to do
(:class:`dtrain_cli.runtime.sync.base.SyncRuntime`).
"""

from __future__ import annotations

from typing import ClassVar

from dtrain_cli.sync_modes.base import SyncMode, register


@register
class EveryStep(SyncMode):
    name: ClassVar[str] = "sync"
    summary: ClassVar[str] = "every step, through the strategy's own collectives"
    runtime: ClassVar[str] = "dtrain_cli.runtime.sync.base:SyncRuntime"
    order: ClassVar[int] = 0
