"""Which rank failed first, and why: the launcher's report of a failed run.

    DTRAIN_FAULTS="kill:step=2:rank=1" dtrain launch recipe=gpt_tiny dp=2
    error: rank 1 was killed by SIGKILL after step 2; rank 0 then lost its peer (...)

The agent's ``ChildFailedError`` lists every worker that had ended with an error when it
looked. torch's ``get_first_failure`` takes the smallest error-file timestamp, in whole
seconds, and a rank killed by a signal gets the time the agent noticed it; so the rank that
*lost* its peer (``Connection reset by peer``, a collective timeout) is often blamed for the
peer's death. Here a rank killed by a signal, or failing with an error of its own, is the
cause; a rank whose error is a lost connection or a timeout followed it. The step and the
precise time come from the workers' notes (:mod:`dtrain_cli.rundir.notes`).
Torch-free: the inputs are the agent's ``ProcessFailure`` objects (duck-typed).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.notes import OWN_SOCKET, innermost_frame, is_peer_loss, not_arrived

# Errors the runtime raises on purpose, with a message that names the cause: shown as one
# line (their traceback stays in logs/rank_<k>.log).
EXPECTED_ERRORS = (
    "CheckpointError:",
    "FileNotFoundError:",
    "ValueError: ",
    "NumericsError:",
    "ReplicaError:",
    "CollectiveMismatch:",
)


@dataclass
class Failed:
    rank: int
    exitcode: int | None
    """The process's exit code (negative: a signal); None when the agent did not report it."""
    headline: str = ""
    """The error's first line ("RuntimeError: ..."); "" for a signal or a silent rank."""
    detail: str = ""
    """What to show under the report: nothing for dtrain's own errors, else where it was
    raised and the log with the traceback (your script's run: python's traceback)."""
    time: float = float("inf")
    step: int | None = None
    signal: str | None = None
    exited: bool = False
    """Your script ended itself (``sys.exit(3)``): ``headline`` is the last line it
    printed, not an error."""

    @property
    def lost_peer(self) -> bool:
        return self.signal is None and is_peer_loss(self.headline)

    @property
    def silent(self) -> bool:
        """Ended without an error of its own and without a reported exit code."""
        return self.exitcode is None and not self.headline and self.signal is None


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def where_detail(headline: str, where: str | None, rank: int) -> str:
    """The line under the report for an error that is not one of dtrain's own: the frame
    that raised it and the log that holds the whole traceback. The same whether the
    agent's error file or the rank's note told it (one report for one failure)."""
    if not headline or headline.startswith(EXPECTED_ERRORS):
        return ""
    log = RunDir(Path(".")).rank_log(rank)
    return f"  at {where}; traceback in {log}" if where else f"  traceback in {log}"


def from_agent(
    failures: Mapping[int, Any],
    notes: Mapping[int, Mapping[str, Any]],
    local_ranks: list[int] | None = None,
) -> list[Failed]:
    """The agent's {global rank: ProcessFailure} (torch reports the first process it found
    dead, not every one), the workers' notes of this attempt (by pid), and this node's
    other ranks (``local_ranks``) that left neither: silent."""
    out: dict[int, Failed] = {}
    by_pid = {f.pid: int(r) for r, f in failures.items()}
    for rank, f in failures.items():
        headline = f.message if isinstance(f.message, str) else str(f.message)
        note = notes.get(f.pid, {})
        where = note.get("where")
        data = f.error_file_data or {}
        trace = data.get("message", {}) if isinstance(data, dict) else {}
        if isinstance(trace, dict) and trace:
            headline = str(trace.get("message", ""))
            where = innermost_frame(trace.get("extraInfo", {}).get("py_callstack", "")) or where
        sig = _signal_name(f.exitcode) if f.exitcode < 0 else None
        if sig:  # torch's "Signal 9 (SIGKILL) received by PID ..." says no more
            headline = ""
        headline = headline.splitlines()[0] if headline else ""
        out[int(rank)] = Failed(
            rank=int(rank),
            exitcode=int(f.exitcode),
            headline=headline,
            detail=where_detail(headline, where, int(rank)),
            time=float(note.get("time", f.timestamp)),
            step=note.get("step"),
            signal=sig or note.get("signal"),
        )
    for pid, note in notes.items():
        rank = int(note.get("rank", -1))
        if pid in by_pid or rank < 0 or rank in out:
            continue
        headline = str(note.get("error", "")).splitlines()[0] if note.get("error") else ""
        out[rank] = Failed(
            rank=rank,
            # your script's sys.exit(3), before it ended; an exception that escaped: 1
            exitcode=note.get("exitcode", 1 if headline else None),
            headline=headline,
            detail=where_detail(headline, note.get("where"), rank),
            time=float(note["time"]),
            step=note.get("step"),
            signal=note.get("signal"),
        )
    for rank in local_ranks or []:
        out.setdefault(rank, Failed(rank=rank, exitcode=None))
    return sorted(out.values(), key=lambda f: f.rank)


def _when(step: int | None, unknown: str = "during start-up") -> str:
    if step is None:
        return unknown
    return "in step 1" if step == 0 else f"after step {step}"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _same(a: Failed, b: Failed) -> bool:
    """The same error, told apart only by the numbers each rank puts in it (its rank, its
    device: ``device_ids [0]`` on rank 0, ``[1]`` on rank 1), with the same exit code
    (``sys.exit(4 + rank)``: 'rank 1 too' hid rank 1's 5)."""
    return (_shape(a.headline), a.signal, a.exitcode) == (_shape(b.headline), b.signal, b.exitcode)


def _shape(headline: str) -> str:
    return re.sub(r"\d+", "N", headline)


NO_CUDA = ("has no attribute '_cuda_", "not compiled with cuda enabled")
NO_GPU = ("found no nvidia driver", "no cuda gpus are available")


def failure_hint(headline: str) -> str | None:
    """What an error of a user's code means here and what to do: CUDA in code written for
    GPUs (and what runs on both: a device, DDP's device_ids), a port already in use; None
    for any other error."""
    text = headline.lower()
    if any(p in text for p in OWN_SOCKET):
        return (
            "another process on this node holds that port: the launcher's store listens at "
            "MASTER_PORT (as torchrun's does), so a TCPStore of the script's there connects "
            "on every rank (is_master=False) or takes a port of its own; or the script sets "
            "its own MASTER_PORT on more than one rank (leave it as the launcher sets it), "
            "starts its own ranks on each of them (run it as one process), or another job "
            "uses it"
        )
    pick = "pick the device with torch.device('cuda' if torch.cuda.is_available() else 'cpu')"
    if any(p in text for p in NO_CUDA):
        return f"the code uses CUDA, which this torch (a CPU wheel) lacks: {pick}"
    if any(p in text for p in NO_GPU):
        return f"the code uses CUDA and this machine has no GPU torch can use: {pick}"
    if "device_ids and output_device arguments only work with" in text:
        return (
            "device_ids names the GPU of a module on a GPU; a module on the CPU takes none: "
            "DDP(model, device_ids=[local_rank] if torch.cuda.is_available() else None)"
        )
    if "invalid device ordinal" in text:
        return (
            "a rank asked for a GPU this node does not have (cuda:LOCAL_RANK past the "
            "last one); start at most one rank per GPU (parallel.nproc_per_node)"
        )
    return None


FATAL_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
"""A rank's own fault (a C extension's, an abort): Python's faulthandler prints its stack."""


PREEMPTION_SIGNALS = ("SIGUSR1", "SIGUSR2")
"""What ``cluster.signal`` may be besides SIGTERM and SIGHUP: nothing else sends them."""


def _cause_text(root: Failed, when: str, lost_when: str) -> str:
    """The first failure: its signal, its exit code and last line, or its error, with a
    hint where one is known."""
    if root.signal in FATAL_SIGNALS:  # faulthandler wrote where (dtrain's ranks enable it)
        stack = f"; its Python stack is in logs/rank_{root.rank}.log"
        return f"rank {root.rank} was killed by {root.signal}{lost_when}{stack}"
    if root.signal in PREEMPTION_SIGNALS:  # the script has no handler for it
        return (
            f"rank {root.rank} was killed by {root.signal}{lost_when}: the preemption signal "
            "(cluster.signal; SLURM sends it before the time limit), which a script handles "
            "by saving its checkpoint and exiting 75 (docs/own-script.md#preemption)"
        )
    if root.signal is not None:
        return f"rank {root.rank} was killed by {root.signal}{lost_when}"
    hint = failure_hint(root.headline)
    if root.exited:
        said = f' (its last line: "{root.headline}")' if root.headline else ""
        said += f"; {hint}" if hint else ""
        return f"rank {root.rank} exited with code {root.exitcode}{when}{said}"
    code = f" (exit code {root.exitcode})" if root.exitcode is not None else ""
    said = f": {root.headline}" if root.headline else ""
    said += f"; {hint}" if hint else ""
    return f"rank {root.rank} failed{when}{code}{said}"


def _others_text(root: Failed | None, causes: list[Failed], lost: list[Failed]) -> str:
    """What the other ranks did: lost their peer, failed the same way, or otherwise."""
    text = ""
    followers = [f for f in lost if f is not root]
    if followers:
        verb = "lost its peer" if len(followers) == 1 else "lost their peer"
        text += f"; {_ranks([f.rank for f in followers])} then {verb} ({followers[0].headline})"
    same = [f.rank for f in causes if f is not root and root and _same(f, root)]
    if same:
        text += f"; {_ranks(same)} too"
    for f in causes:
        if f is not root and f.rank not in same:
            how = f"was killed by {f.signal}" if f.signal else f"failed ({f.headline})"
            how = f"exited with code {f.exitcode}" if f.exited else how
            text += f"; rank {f.rank} also {how}"
    return text


def describe(
    failed: list[Failed], steps_known: bool = True, multi_node: bool = False
) -> tuple[int, str]:
    """(exit code, report): the first failure in time with its signal or exit code, then
    the ranks that followed it (lost their peer). When every error seen is a lost peer, the
    ranks that left no error of their own are the cause (killed, or frozen); on a node of a
    ``multi_node`` run that sees none, a rank of another node.
    ``steps_known=False``: your own script's run, whose steps dtrain does not see."""

    def when(step: int | None) -> str:
        text = _when(step, "during start-up" if steps_known else "")
        return f" {text}" if text else ""

    errors = [f for f in failed if not f.silent]
    causes = [f for f in errors if not f.lost_peer]
    if any(f.signal != "SIGTERM" for f in causes):  # the agent's SIGTERM ended the rest
        causes = [f for f in causes if f.signal != "SIGTERM"]
    lost = [f for f in errors if f.lost_peer]
    silent = [f for f in failed if f.silent]
    steps = [f.step for f in lost if f.step is not None]
    lost_when = when(min(steps)) if steps else ""
    if late := [f for f in causes if not_arrived(f.headline)]:  # named by the ranks that came
        root = min(late, key=lambda f: f.rank)
        ranks, seconds = not_arrived(root.headline) or ([], "")
        text = (
            f"{_ranks(ranks)} never reached init_process_group: the others waited {seconds} s "
            f"(launcher.rdzv_timeout_s); see logs/rank_{ranks[0]}.log"
        )
        return 1, text
    if causes:
        root = min(causes, key=lambda f: (f.time, f.signal is None))
        # the same error on several ranks: the lowest rank, whichever arrived first
        root = min((f for f in causes if _same(f, root)), key=lambda f: f.rank)
        text = _cause_text(root, when(root.step), lost_when)
    elif silent and lost:
        root = None
        timeouts = all(
            "timed out" in f.headline.lower() or "timeout" in f.headline.lower() for f in lost
        )
        how = "stopped answering (frozen?)" if timeouts else "ended without an error of its own"
        if not timeouts:
            how += " (killed by a signal?)"
        text = f"{_ranks([f.rank for f in silent])} {how}{lost_when}"
    elif lost and multi_node:  # every rank here lost a peer, none silent: another node's
        root = min(lost, key=lambda f: f.time)
        verb = "lost its peer" if len(lost) == 1 else "lost their peers"
        text = (
            f"{_ranks(sorted(f.rank for f in lost))} {verb}{lost_when} ({root.headline}): a "
            "rank of another node ended first; that node's report and logs say why"
        )
        lost = []  # said
    else:
        root = min(errors or failed, key=lambda f: f.time)
        text = f"rank {root.rank} failed{when(root.step)} (exit code {root.exitcode})"
    text += _others_text(root, causes, lost)
    detail = root.detail if root is not None else ""
    if detail and detail != root.headline:  # a traceback: dtrain's own errors are one line
        text += f"\n{detail}"
    exitcode = root.exitcode if root is not None and root.exitcode else 0
    return (exitcode if exitcode > 0 else 1), text
