"""Fault injection for recovery and diagnosis drills: a chosen rank misbehaves at a step.

    DTRAIN_FAULTS="kill:step=13:rank=1" dtrain launch recipe=gpt_tiny dp=2 launcher.max_restarts=1
    DTRAIN_FAULTS="hang:step=2:rank=1" dtrain launch recipe=gpt_tiny dp=2 \\
        debug.collective_timeout_s=10

Points: ``kill`` (end of a training step) and ``kill_in_save`` (while a checkpoint's
temporary folder is being written): the process dies by SIGKILL, as on a lost node;
``segv`` (end of a training step): it reads address 0, as a C extension's fault does;
``stop`` (end of a training step): the process stops itself with SIGSTOP, as when frozen
from outside (its watchdog cannot run); ``slow_save:ms=M`` (a save takes M ms longer);
``hang`` (end of a training step): the process stays alive but never reaches the next
collective, as on a stuck device (the hang watchdog names it after
``debug.collective_timeout_s``; with the watchdog off, its peers fail after the process
group's timeout, ``debug.collective_timeout_s`` with ``debug.hang_watchdog=false``).
Diagnosis drills (:func:`armed`, read by the loop at fixed points): ``slow`` (``ms`` of
sleep in every step: a straggler), ``nan`` (that step's loss and a gradient become NaN),
``spike`` (its loss x1000), ``mismatch`` (the logging all-reduce with another shape),
``perturb`` (a parameter changed after the optimizer step: a diverging replica),
``drop`` (the step's data window is cut from the stream: the step trains on the next one;
a reference for the skip and rollback policies).
``step`` and ``rank`` select where; a drill without them fires everywhere. Every fault
fires on the first attempt only, so an elastic restart can show that the run recovers.
Membership drills: ``kill_node`` / ``kill_node_in_save`` (the points of ``kill``) SIGKILL
this process's whole process group (the node's launcher, agent, fork server and workers,
when the launcher leads its group), as on a node that is lost; ``throttle:ms=N`` sleeps N
ms after every step of every attempt (``:world=W``: only while the group has W processes),
for drills that need time to act while the run goes on.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from dtrain_cli.rundir import env


def _parse(spec: str) -> list[tuple[str, dict[str, int]]]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, *args = item.split(":")
        params = {k: int(v) for k, v in (a.split("=", 1) for a in args)}
        out.append((name, params))
    return out


def _faults() -> list[tuple[str, dict[str, int]]]:
    """The drills of ``DTRAIN_FAULTS`` as this process has it now (read per call, not at
    import: a process forked with this module loaded may have been given another)."""
    spec = env.fault_spec()
    return _parse(spec) if spec else []


def armed(point: str, **where: int) -> dict[str, int] | None:
    """The parameters of the drill armed for ``point`` where its ``step``/``rank`` (if
    given) match ``where``; None otherwise (cheap when no fault is set)."""
    faults = _faults()
    if not faults or env.restart_count() != 0:
        return None
    for name, params in faults:
        if name == point and all(
            where.get(k) == v for k, v in params.items() if k in ("step", "rank")
        ):
            return params
    return None


def maybe_fail(point: str, **where: int) -> None:
    """SIGKILL this process if a fault is armed for ``point`` at ``where`` (first attempt)."""
    faults = _faults()
    if not faults:
        return
    for name, params in faults:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if name == "throttle" and point == "kill" and params.get("world", world) == world:
            time.sleep(params.get("ms", 0) / 1000)
    if env.restart_count() != 0:
        return
    for name, params in faults:
        at = {
            "hang": "kill",
            "segv": "kill",
            "stop": "kill",
            "kill_node": "kill",
            "kill_node_in_save": "kill_in_save",
        }.get(name, name)  # a hang fires where kill does
        if at == point and all(where.get(k) == v for k, v in params.items()):
            if name == "hang":  # frozen: alive, silent (a real hang leaves no note)
                while True:
                    time.sleep(3600)
            if name == "segv":  # a C extension's fault: SIGSEGV, where faulthandler shows
                import ctypes

                ctypes.string_at(0)
            if name == "stop":  # stopped from outside (SIGSTOP): not even its watchdog runs
                os.kill(os.getpid(), signal.SIGSTOP)
                continue
            if name.startswith("kill_node"):  # the node is gone: no note, nobody left
                os.killpg(os.getpgrp(), signal.SIGKILL)
            _note_drill(name, where)
            os.kill(os.getpid(), signal.SIGKILL)


# -- the diagnosis drills, called by the loop at fixed points (no-ops when none is armed) --
def slow_save(step: int, rank: int) -> None:
    """``slow_save:ms=M``: a checkpoint save takes M ms longer (a slow file system), on
    every rank unless ``rank`` says which: longer than the hang watchdog's limit is no hang."""
    if drill := armed("slow_save", step=step, rank=rank):
        time.sleep(drill.get("ms", 1000) / 1000)


def before_step(step: int, rank: int) -> None:
    """``slow``: this rank sleeps ``ms`` (default 200) before the step: a straggler."""
    if (slow := armed("slow", step=step, rank=rank)) and "factor" not in slow:  # factor: straggle
        time.sleep(slow.get("ms", 200) / 1000)


def drops_data(step: int, rank: int) -> bool:
    """``drop:step=S``: step S trains on the next step's window, and every later step one
    further (the window of S is cut from the stream; without ``rank``, on every rank)."""
    return armed("drop", step=step, rank=rank) is not None


def after_backward(loss: Any, params: Callable[[], list[Any]], step: int, rank: int) -> Any:
    """``nan``: the step's loss and the first gradient (after the reduce) become NaN;
    ``spike``: the loss the numerics policy sees is x1000. Returns the loss."""
    if armed("nan", step=step, rank=rank):
        loss = loss * float("nan")
        next(p.grad for p in params() if p.grad is not None).fill_(float("nan"))
    if armed("spike", step=step, rank=rank):
        loss = loss * 1000.0
    return loss


def after_update(params: Callable[[], list[Any]], step: int, rank: int) -> None:
    """``perturb``: the second parameter moves by 1e-3 on this rank (a diverging replica)."""
    if armed("perturb", step=step, rank=rank):
        params()[1].data.add_(1e-3)


def before_logging(step: int, rank: int) -> list[float] | None:
    """``mismatch``: this rank joins the logging all-reduce with one more element.
    Returns the extra slots for the all-reduce."""
    return [0.0] if armed("mismatch", step=step, rank=rank) else None


def _note_drill(name: str, where: dict[str, int]) -> None:
    """A drill says what it did (a real SIGKILL leaves no trace): the launcher's report
    then names the signal (:mod:`dtrain_cli.rundir.notes`)."""
    run_dir = env.run_dir()
    if run_dir:
        from dtrain_cli.rundir.notes import write_note

        step = where.get("step")
        write_note(run_dir, int(os.environ.get("RANK", "-1")), step, None, "SIGKILL")


def straggle(rank: int, step_s: float) -> None:
    """``slow:rank=R:factor=F``: rank R sleeps (F - 1) x its step time after every step, a
    worker F times slower (for the staleness drills). Every attempt, unlike the others."""
    for name, params in _faults():
        if name == "slow" and params.get("rank", rank) == rank and params.get("factor", 1) > 1:
            time.sleep((params["factor"] - 1) * step_s)
