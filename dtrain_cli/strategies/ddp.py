"""``parallel.strategy=ddp``: every dp rank holds the whole model; gradients all-reduced.

    dtrain launch recipe=gpt_small dp=4
    dtrain launch recipe=gpt_small dp=4 comm.compression=powersgd comm.powersgd_rank=4

torch's ``DistributedDataParallel``: bucketed all-reduce overlapped with backward, with an
optional communication hook (fp16, bf16, PowerSGD). Runtime half:
:class:`dtrain_cli.runtime.parallel.ddp.DDPRuntime`.
"""

from __future__ import annotations

from typing import ClassVar

from dtrain_cli.strategies.base import Strategy, register


@register
class DDP(Strategy):
    name: ClassVar[str] = "ddp"
    summary: ClassVar[str] = "replicated: gradients all-reduced (DistributedDataParallel)"
    runtime: ClassVar[str] = "dtrain_cli.runtime.parallel.ddp:DDPRuntime"
    simplicity: ClassVar[int] = 0
    comm_hooks: ClassVar[bool] = True
