"""Fault injection for recovery and diagnosis drills: a chosen rank misbehaves at a step.

    DTRAIN_FAULTS="kill:step=13:rank=1" dtrain launch recipe=gpt_tiny dp=2 launcher.max_restarts=1
    DTRAIN_FAULTS="hang:step=7:rank=1" dtrain launch recipe=gpt_tiny dp=2 \\
        debug.collective_timeout_s=10

Points: ``kill`` (end of a training step) and ``kill_in_save`` (while a checkpoint's
temporary folder is being written): the process dies by SIGKILL, as on a lost node.
Diagnosis drills (:func:`armed`, read by the loop's components): ``hang`` (sleep before
the logging step's all-reduce: a rank that never joins it), ``slow`` (``ms`` of sleep in
every step: a straggler), ``nan`` (that step's loss and a gradient become NaN),
``spike`` (its loss x1000), ``mismatch`` (the logging all-reduce with another shape),
``perturb`` (a parameter changed after the optimizer step: a diverging replica).
``step`` and ``rank`` select where; a drill without them fires everywhere. Every fault
fires on the first attempt only, so an elastic restart can show that the run recovers.
"""

from __future__ import annotations

import os
import signal

ENV = "DTRAIN_FAULTS"


def _parse(spec: str) -> list[tuple[str, dict[str, int]]]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, *args = item.split(":")
        params = {k: int(v) for k, v in (a.split("=", 1) for a in args)}
        out.append((name, params))
    return out


_FAULTS = _parse(os.environ.get(ENV, ""))


def armed(point: str, **where: int) -> dict[str, int] | None:
    """The parameters of the drill armed for ``point`` where its ``step``/``rank`` (if
    given) match ``where``; None otherwise (cheap when no fault is set)."""
    if not _FAULTS or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    for name, params in _FAULTS:
        if name == point and all(
            where.get(k) == v for k, v in params.items() if k in ("step", "rank")
        ):
            return params
    return None


def maybe_fail(point: str, **where: int) -> None:
    """SIGKILL this process if a fault is armed for ``point`` at ``where`` (first attempt)."""
    if not _FAULTS or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    for name, params in _FAULTS:
        if name == point and all(where.get(k) == v for k, v in params.items()):
            os.kill(os.getpid(), signal.SIGKILL)
