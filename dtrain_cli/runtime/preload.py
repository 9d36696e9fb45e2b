"""What a worker imports before its first step, so the launcher can import it once.

With ``start_method=fork`` the elastic agent imports these modules before it starts the
workers, which inherit them (one import on one core instead of one per worker); with
``forkserver`` they are the server's preload list. Modules a run does not use before step
1 stay out: ``torch.distributed.checkpoint`` (about 0.7 s) is imported at the first save,
pipelining and DTensor (about 1 s together) only when the layout uses them.
"""

from __future__ import annotations

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan

# How the launcher hands the fork server its wait (dtrain_cli.launch.worker_server ->
# dtrain_cli.runtime.server_preload): the file the module list will appear in, and the
# launcher's pid (the server stops waiting when it is gone).
PRELOAD_FILE_ENV = "DTRAIN_PRELOAD_FILE"
LAUNCHER_PID_ENV = "DTRAIN_PRELOAD_LAUNCHER_PID"
FIRST_IMPORTS_ENV = "DTRAIN_PRELOAD_FIRST"
"""What the server imports at once, before the plan exists (comma-separated)."""
WORKER_FIRST = ("dtrain_cli.runtime.worker",)
SCRIPT_FIRST = ("dtrain_cli.runtime.script_worker", "torch", "torch.distributed")
"""``dtrain run``: your script's workers need torch, not dtrain's trainer."""

CHECKPOINT_MODULES = (
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "dtrain_cli.runtime.safe_load",
)


def modules_before_first_step(cfg: DtrainConfig, plan: Plan, resuming: bool) -> list[str]:
    """Importable module names, cheapest first; importing them is optional (a speed-up)."""
    axes = dict(zip(plan.mesh.dim_names, plan.mesh.shape, strict=True))
    mods = ["dtrain_cli.runtime.worker"]
    if axes["dp"] > 1 or cfg.train.compile:
        # DistributedDataParallel's constructor touches torch._dynamo (about 1 s)
        mods.append("torch._dynamo")
    if axes["dp"] > 1 and plan.strategy == "fsdp":
        mods.append("torch.distributed.fsdp")
    if axes["dp"] > 1 and plan.strategy == "zero1":
        mods.append("torch.distributed.optim")
    if axes["tp"] > 1:
        mods.append("dtrain_cli.runtime.tensor_parallel")
    if plan.pipeline is not None:
        mods.append("dtrain_cli.runtime.pipeline")
    if resuming:
        mods.extend(CHECKPOINT_MODULES)
    from dtrain_cli.models import model_spec

    return mods + model_spec(cfg).worker_modules()
