"""What a resume from a checkpoint of one config may not do as another: the keys a resume
must keep (:mod:`dtrain_cli.config.resume_changes`) and what the sync modes of both say
(replicas that step alone checkpoint state of their own); what a restart resumes from.
Torch-free.

    dtrain resume --ckpt runs/<run> dp=4     # exit 2 when the checkpoint cannot go there
"""

from __future__ import annotations

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.sync_modes import mode_for


def resume_problems(old: DtrainConfig, new: DtrainConfig) -> list[str]:
    """One line per change a resume cannot make, each naming the checkpoint's value."""
    # imported here: it needs OmegaConf, which a plan from the composition cache never loads
    from dtrain_cli.config.resume_changes import unsafe_resume_changes

    out = unsafe_resume_changes(old, new)
    for mode in dict.fromkeys([old.sync.mode, new.sync.mode]):  # either may refuse
        out += [p for p in mode_for(mode).resume_problems(old, new) if p not in out]
    return out


def restart_warning(cfg: DtrainConfig) -> str | None:
    """A run that restarts (``launcher.max_restarts``) resumes from its newest checkpoint:
    one that saves only at its end restarts from step 0 after a crash (a preemption saves
    one on its signal)."""
    ck, restarts = cfg.checkpoint, cfg.launcher.max_restarts
    if not restarts or ck.every_steps or ck.every_minutes or cfg.script.path or cfg.script.module:
        return None
    return (
        f"launcher.max_restarts={restarts}: a restart resumes from the newest checkpoint, and "
        "this run saves none before its end (checkpoint.every_steps=0, every_minutes=0): after "
        "a crash it starts over from step 0; set checkpoint.every_steps=N or every_minutes=M"
    )
