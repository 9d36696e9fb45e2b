"""The plan's view of the sync mode (``sync.mode``, :mod:`dtrain_cli.sync_modes`): its
problems, extra processes, roles and bytes per role. Pure, torch-free.

    dtrain plan recipe=gpt_small dp=4 sync.mode=param_server sync.servers=2
"""

from __future__ import annotations

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.models.spec import ModelFacts
from dtrain_cli.sync_modes import mode_for
from dtrain_cli.sync_modes.base import SyncPlan


def num_servers(cfg: DtrainConfig) -> int:
    """Processes the launcher starts in addition to dp*tp*pp."""
    return mode_for(cfg.sync.mode).extra_processes(cfg)


def sync_plan(cfg: DtrainConfig, facts: ModelFacts, ddp_bytes: int) -> SyncPlan | None:
    return mode_for(cfg.sync.mode).sync_plan(cfg, facts, ddp_bytes)


def sync_rows(plan_sync: SyncPlan) -> list[tuple[str, object]]:
    """``dtrain plan`` rows: who serves what, bytes per step per role."""
    s = plan_sync
    rows: list[tuple[str, object]] = [("mode", s.mode), *mode_for(s.mode).plan_rows(s)]
    for role, b in s.bytes_per_step.items():
        rows.append((f"{role}: sent / received per step", f"{b['sent']:,} B / {b['received']:,} B"))
    if s.worker_state_bytes:
        held = f"{s.worker_state_bytes / 2**20:,.1f} MiB (in the optimizer state per rank)"
        rows.append(("worker: the mode's own state", held))
    rows.append(("DDP would send per rank per step", f"{s.ddp_bytes_per_step:,} B"))
    return rows
