"""The runtime half of ``ddp`` and ``zero1``: torch's ``DistributedDataParallel``.

    dtrain launch recipe=gpt_small dp=4 comm.compression=powersgd comm.powersgd_rank=4
    dtrain launch recipe=gpt_small dp=4 parallel.strategy=zero1

Bucketed all-reduce overlapped with backward, with an optional communication hook:
torch's fp16 and PowerSGD hooks, and a bf16 hook (torch's own insists on NCCL; gloo
reduces bf16 fine), or the sync mode's (post-local-SGD). DDP's own runtime logging times
forward, backward and communication on logging steps. With tensor parallel (DTensor
parameters), or under a zero-bubble pipeline schedule (which computes weight gradients
outside DDP's hooks), torch's ``replicate`` on the dp sub-mesh. ``zero1`` shards the
optimizer state with ``ZeroRedundancyOptimizer`` over the dp group.
PowerSGD's error feedback and low-rank state belong to each rank: :meth:`rank_state`
puts them into the checkpoint per parameter (:mod:`.powersgd`), so a resume continues
bit for bit.
"""

# no `from __future__ import annotations`: DDP's register_comm_hook checks the hook's
# annotations against dist.GradBucket, which string annotations fail
import importlib
import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.mesh.schedules import SPLIT_BACKWARD
from dtrain_cli.models import ModelSpec
from dtrain_cli.runtime.parallel.data_parallel import DataParallelRuntime
from dtrain_cli.runtime.parallel.mesh import DistContext
from dtrain_cli.runtime.parallel.powersgd import PowerSGDHook
from dtrain_cli.sync_modes import mode_for

log = logging.getLogger("dtrain")


def bf16_allreduce_hook(
    group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16_compress_hook without its NCCL-only guard (DDP refuses a hook of that
    name off NCCL): cast the bucket to bf16, all-reduce (gloo and NCCL both reduce bf16),
    cast back in place."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        return buffer.copy_(fut.value()[0])

    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


def simulated_allreduce_hook(
    group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's all-reduce on the fake backend (``dtrain simulate``), whose futures carry no
    value: the same collective on the bucket, its future completed with the bucket."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=group)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def comm_hook(
    cfg: DtrainConfig, group: dist.ProcessGroup, model: nn.Module
) -> tuple[Any, Any] | None:
    """(hook, state) for DDP's ``register_comm_hook``: the sync mode's, or comm.compression's;
    None keeps DDP's built-in (C++) all-reduce."""
    if (factory := mode_for(cfg.sync.mode).ddp_comm_hook) is not None:
        module, _, attr = factory.partition(":")
        return getattr(importlib.import_module(module), attr)(cfg, group)
    comp = cfg.comm.compression
    if comp == "fp16":
        return default_hooks.fp16_compress_hook, group
    if comp == "bf16":
        return bf16_allreduce_hook, group
    if comp == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=cfg.comm.powersgd_rank,
            start_powerSGD_iter=max(cfg.comm.powersgd_start_iter, 2),  # torch requires >= 2
            use_error_feedback=True,
            warm_start=True,
            random_seed=cfg.train.seed,
        )
        names = {id(p): name for name, p in model.named_parameters()}
        return PowerSGDHook(state, names), state
    return None


def apply_ddp(model: nn.Module, cfg: DtrainConfig, ctx: DistContext) -> nn.Module:
    from dtrain_cli.runtime.diagnostics.collective_debug import unwrapped_group

    group = unwrapped_group(ctx.mesh, ctx.dp_group)  # the dp group (debug.check_collectives)
    ddp = DDP(
        model,
        process_group=group,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=cfg.comm.bucket_mb,
        find_unused_parameters=cfg.parallel.find_unused_parameters,
        gradient_as_bucket_view=True,
    )
    hook = comm_hook(cfg, group, model)
    if hook is None and ctx.simulated:
        hook = simulated_allreduce_hook, group
    if hook is not None:
        ddp.register_comm_hook(hook[1], hook[0])
        ddp.comm_state = hook[1]  # type: ignore[attr-defined]
        ddp.comm_hook = hook[0]  # type: ignore[attr-defined]
    # DDP times forward, backward compute, backward communication and their overlap on
    # sampled iterations; sample the logging steps (read by step_times()).
    ddp._set_ddp_runtime_logging_sample_rate(max(1, cfg.logging.every))
    return ddp


def ddp_step_times(model: nn.Module) -> dict[str, float]:
    """DDP's own timings of its latest sampled step, in ms: forward, backward compute,
    gradient communication, and the communication not hidden behind backward compute."""
    if not isinstance(model, DDP):
        return {}
    data = model._get_ddp_logging_data()
    if "backward_comm_time" not in data:
        return {}
    ms = {
        k: data.get(k, 0) / 1e6
        for k in (
            "forward_compute_time",
            "backward_compute_time",
            "backward_comm_time",
            "backward_compute_comm_overlap_time",
        )
    }
    return {
        "forward_ms": ms["forward_compute_time"],
        "backward_compute_ms": ms["backward_compute_time"],
        "comm_ms": ms["backward_comm_time"],
        "comm_exposed_ms": max(
            0.0, ms["backward_comm_time"] - ms["backward_compute_comm_overlap_time"]
        ),
    }


class DDPRuntime(DataParallelRuntime):
    def apply(
        self,
        model: nn.Module,
        spec: ModelSpec,
        cfg: DtrainConfig,
        ctx: DistContext,
        schedule: str | None,
    ) -> nn.Module:
        if ctx.mesh["tp"].size() > 1 or schedule in SPLIT_BACKWARD:
            from torch.distributed._composable.replicate_with_fsdp import replicate

            return replicate(model, mesh=ctx.dp_mesh)
        if ctx.simulated:  # DDP reads its parameters at construction: allocate them first
            from dtrain_cli.runtime.parallel.fake_ddp import RealBookkeeping, keep_bookkeeping_real
            from dtrain_cli.runtime.parallel.materialize import allocate_local

            allocate_local([model], ctx.device)
            with RealBookkeeping():  # --compute fake: the reducer's index tensors stay real
                ddp = apply_ddp(model, cfg, ctx)
            keep_bookkeeping_real(ddp)
        else:
            ddp = apply_ddp(model, cfg, ctx)
        if schedule is not None:
            # torch's PipelineStage starts DDP's reduction itself at a step's last backward
            # and runs its forwards under no_sync, except the shape-inference forward of the
            # first step: in sync mode that one arms the reducer, its input-only backward
            # never disarms it, so the step's first backward reduces too and the last one
            # records every parameter a second time (step 2: INTERNAL ASSERT "rebuilt params
            # size of: 68" unless a forward ran in between, as 1f1b with >= 3 micro-batches
            # does). So no forward of a stage prepares a reduction.
            ddp.require_backward_grad_sync = False
        return ddp

    def step_times(self, parts: list[nn.Module]) -> dict[str, float]:
        for part in parts:
            if times := ddp_step_times(part):
                return times
        return {}

    def rank_state(self, parts: list[nn.Module]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for i, part in enumerate(parts):
            if isinstance(hook := getattr(part, "comm_hook", None), PowerSGDHook):
                out.update(hook.rank_state(prefix=f"powersgd.{i}."))
        return out

    def load_rank_state(
        self, parts: list[nn.Module], state: dict[str, torch.Tensor], step: int
    ) -> None:
        for i, part in enumerate(parts):
            if not isinstance(hook := getattr(part, "comm_hook", None), PowerSGDHook):
                continue
            prefix = f"powersgd.{i}."
            mine = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            if mine:
                hook.load_rank_state(mine)
            else:
                hook.state.iter = step  # the warm-up (start_powerSGD_iter) counts steps
                log.warning(
                    "comm.compression=powersgd: no error feedback for this rank in the "
                    "checkpoint (another dp, or saved before it was kept): starts afresh"
                )


class ZeRO1Runtime(DDPRuntime):
    def optimizer_group(self, ctx: DistContext) -> Any:
        return ctx.dp_group
