"""Whether a planned layout fits its device: the plan's peak memory per device
(:func:`.steptime.peak_memory`, what ``dtrain plan`` prints and ``dtrain advise`` ranks by)
against the hardware profile's capacity, said before a cluster finds it out. Torch-free.

    dtrain plan recipe=gpt_1b parallel.strategy=fsdp dp=8
    warning: peak memory per device estimated at 1,942 GiB, above hardware=h100_80g's
    78 GiB; most of it activations (1,900 GiB): train.micro_batch_size=4 ...
"""

from __future__ import annotations

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models.spec import ModelSpec
from dtrain_cli.plan.plan import Plan
from dtrain_cli.plan.steptime import GIB, Memory, peak_memory


def memory_warning(cfg: DtrainConfig, spec: ModelSpec, plan: Plan) -> str | None:
    """One line when the estimate is above the device's memory, with what dominates it and
    what lowers that; None when it fits, for a script (its model is its own) or under the
    CPU profile (the default) for a CUDA run, whose GPUs no profile was named for. A GPU
    profile is kept on any machine: ``dtrain plan`` here plans the cluster's run."""
    hw = cfg.hardware
    if plan.script is not None or hw.memory_gib <= 0:
        return None
    if hw.device == "cpu" and plan.device != "cpu":
        return None
    m = peak_memory(cfg, spec, plan, hw)
    if m.fits:
        return None
    parts = {
        "parameters": m.params,
        "gradients": m.grads,
        "optimizer state": m.optimizer,
        "activations": m.activations,
        "temporary buffers": m.temporary,
    }
    most = max(parts, key=lambda k: parts[k])
    return (
        f"peak memory per device estimated at {_gib(m.total)} GiB, above "
        f"hardware={hw.name}'s {_gib(m.capacity)} GiB; most of it {most} "
        f"({_gib(parts[most])} GiB): {_remedy(most, m, plan)}; dtrain advise ranks the "
        "layouts that fit"
    )


def _remedy(most: str, m: Memory, plan: Plan) -> str:
    if most in ("activations", "temporary buffers"):  # both grow with the micro-batch
        b = plan.batch
        fixed = m.params + m.grads + m.optimizer
        per_sample = (m.activations + m.temporary) / max(b.micro_batch_size, 1)
        room = int((m.capacity - fixed) // max(per_sample, 1.0))
        per_rank = b.global_batch_size // max(b.dp, 1)
        fits = [n for n in range(1, min(room, b.micro_batch_size - 1) + 1) if per_rank % n == 0]
        if fits:
            return (
                f"train.micro_batch_size={fits[-1]} (gradient accumulation keeps the global "
                "batch), or parallel.activation_checkpointing=full"
            )
        return "parallel.activation_checkpointing=full, or split the model (tp, pp)"
    return (
        "shard them over more devices (parallel.strategy=fsdp, or zero1 for the optimizer "
        "state), tp or pp"
    )


def _gib(n: float) -> str:
    return f"{n / GIB:,.0f}" if n >= 10 * GIB else f"{n / GIB:.1f}"
