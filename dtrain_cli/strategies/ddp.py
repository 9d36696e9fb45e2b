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

    def fake_tensor_problem(self, *, dp: int, tp: int, split_backward: bool) -> str | None:
        """torch's ``DistributedDataParallel`` (no tp, no zero-bubble schedule: otherwise
        the runtime uses torch's ``replicate``) checks its parameters' values across ranks
        when it is built; fake tensors hold none."""
        if dp > 1 and tp == 1 and not split_backward:
            return (
                f"parallel.strategy={self.name} at tp=1: DistributedDataParallel reads its "
                f"parameters' values when it is built, and --compute fake has none; simulate "
                f"it with --compute real (the model must fit this machine), or with tp > 1"
            )
        return None
