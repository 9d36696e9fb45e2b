"""Pipeline parallelism with ``torch.distributed.pipelining``: stages and schedules.

    dtrain launch recipe=gpt_small dp=2 pp=2 pipeline.schedule=interleaved_1f1b \
        pipeline.virtual_stages=2

Every rank builds the full model from the seed (so weights equal the single-process
model) and keeps only its stages' layers (the model's spec cuts them:
``ModelSpec.pipeline_stage``): embeddings on the first stage, norm and head on the last.
Layer names stay those of the full model, so checkpoints reshard between layouts. Stage
placement follows the schedule (loop: stage % pp; V-shaped for zbv and dualpipev), as
torch places them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

from dtrain_cli.mesh.schedules import SCHEDULES, SINGLE_STAGE
from dtrain_cli.plan.plan import PipelinePlan


def stages_of_rank(pipe: PipelinePlan, pp_rank: int) -> list[int]:
    return [s.stage for s in pipe.stages if s.pp_rank == pp_rank]


def build_schedule(
    parts: list[nn.Module],
    stage_ids: list[int],
    pipe: PipelinePlan,
    device: torch.device,
    pp_group: Any,
    loss_fn: Any,
    stage_io: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Any:
    """The schedule object for this rank's stages (``step``/``eval`` on whole batches).
    ``stage_io``: each stage's (input, output) as meta tensors, so no stage asks its
    neighbour for shapes (``dtrain simulate``: a fake process group answers nothing)."""
    io = stage_io or {}
    stages = [
        PipelineStage(
            part,
            stage_id,
            pipe.num_stages,
            device,
            *io.get(stage_id, (None, None)),
            group=pp_group,
        )
        for part, stage_id in zip(parts, stage_ids, strict=True)
    ]
    cls = get_schedule_class(SCHEDULES[pipe.schedule])
    # The loss function scales each micro-batch's loss by 1/(micro-batches per step):
    # torch's own scaling divides every gradient by n_microbatches at the end of each
    # call, which would divide the earlier calls' accumulated gradients again.
    kwargs = {"n_microbatches": pipe.microbatches, "loss_fn": loss_fn, "scale_grads": False}
    return cls(stages[0] if pipe.schedule in SINGLE_STAGE else stages, **kwargs)


def stage_io_meta(
    spec: Any,
    model: nn.Module,
    pipe: PipelinePlan,
    micro_batch: int,
    dtype: torch.dtype | None,
    low_params: bool,
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each stage's (input, output) of one micro-batch, by running the stages of the meta
    model in order under the step's autocast (``low_params``: FSDP's parameters in
    ``dtype``, as its mixed-precision policy casts them: a stage's floating output then
    has that dtype; cast here, since the model's parameters, DTensors under tp, cannot
    be converted in place). Token models only."""
    import contextlib

    x: torch.Tensor = torch.zeros(micro_batch, spec.block_size, dtype=torch.long, device="meta")
    io = {}
    autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
    # with grad: what requires grad decides which gradients flow back; the kind's context
    # for tensors it cannot read (meta ones, as fake)
    with autocast, spec.fake_tensor_context():
        for st in sorted(pipe.stages, key=lambda s: s.stage):
            out = spec.pipeline_stage(model, st)(x)
            if low_params and dtype is not None and out.is_floating_point():
                out = out.to(dtype)
            io[st.stage] = (x, out)
            x = out.detach().requires_grad_(out.is_floating_point())
    return io
