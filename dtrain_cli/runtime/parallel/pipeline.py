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
) -> Any:
    """The schedule object for this rank's stages (``step``/``eval`` on whole batches)."""
    stages = [
        PipelineStage(part, stage_id, pipe.num_stages, device, group=pp_group)
        for part, stage_id in zip(parts, stage_ids, strict=True)
    ]
    cls = get_schedule_class(SCHEDULES[pipe.schedule])
    # The loss function scales each micro-batch's loss by 1/(micro-batches per step):
    # torch's own scaling divides every gradient by n_microbatches at the end of each
    # call, which would divide the earlier calls' accumulated gradients again.
    kwargs = {"n_microbatches": pipe.microbatches, "loss_fn": loss_fn, "scale_grads": False}
    return cls(stages[0] if pipe.schedule in SINGLE_STAGE else stages, **kwargs)
