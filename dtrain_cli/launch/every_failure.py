"""Every worker that had already died when torch's agent noticed a failure, not only one.

    dtrain launch recipe=gpt_tiny dp=2     # kill -9 rank 1: "rank 1 was killed by SIGKILL"

torch's agent polls its workers (``MultiprocessContext._poll``, every
``launcher.monitor_interval_s``); ``torch.multiprocessing.ProcessContext.join`` takes the
first ready process in its list as *the* failure, then ends the rest. A rank killed by a
signal (an OOM kill, ``kill -9``) and the peer that then lost it are often both dead at the
same poll: the peer, lower in the list, was reported, and the killed rank, its exit status
known to its ``Process`` object, was reported as having ended without an error
(:mod:`.failures`: "killed by a signal?"). While the agent runs, :func:`every_failed_process`
adds to the poll's failures every other process that had already exited non-zero when the
poll began (not those the poll's clean-up then ended); :mod:`.failures` then picks the
cause by time and kind. An error file a full disk left empty is removed first
(:func:`drop_unreadable_error_files`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.notes import write_note


@contextlib.contextmanager
def every_failed_process(run_dir: Path) -> Iterator[None]:
    """``MultiprocessContext._poll`` reporting every worker that failed by itself; one
    killed by a signal gets a note in ``run_dir`` (it could write none itself), which a
    restarted group reads to say what ended the attempt before."""
    from torch.distributed.elastic.multiprocessing import api

    original = api.MultiprocessContext._poll

    def _poll(self: Any) -> Any:
        # which had ended before this poll: the poll's own clean-up then ends the rest
        # (SIGTERM, and SIGKILL 30 s later for one that did not stop), not their failures
        pc = getattr(self, "_pc", None)
        ended = {i for i, p in enumerate(pc.processes) if p.exitcode is not None} if pc else set()
        drop_unreadable_error_files(self.error_files, ended)
        result = original(self)
        if result is None or not result.failures or pc is None:
            return result
        for local_rank, proc in enumerate(pc.processes):
            code = proc.exitcode
            if local_rank in result.failures or local_rank not in ended or code in (0, None):
                continue  # reported, ended by this poll's clean-up, or done
            result.failures[local_rank] = api.ProcessFailure(
                local_rank=local_rank,
                pid=proc.pid,
                exitcode=code,
                error_file=self.error_files[local_rank],
            )
        for local_rank, failure in result.failures.items():
            if failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM:
                _note_signal(run_dir, self.envs.get(local_rank, {}), failure)
        return result

    api.MultiprocessContext._poll = _poll  # type: ignore[method-assign]
    try:
        yield
    finally:
        api.MultiprocessContext._poll = original  # type: ignore[method-assign]


def drop_unreadable_error_files(error_files: dict[int, str], ended: set[int]) -> list[str]:
    """Ended workers' error files that are not JSON (0 bytes: a full disk when the rank
    wrote it) are removed: torch's ``ProcessFailure`` re-raised the parse error and the
    agent ended in a 180-line traceback; without the file it reports the exit code, and
    the rank's log says why. Returns the paths removed."""
    removed = []
    for local_rank in ended:
        path = error_files.get(local_rank)
        if not path or not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                json.load(f)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed


def _note_signal(run_dir: Path, env: dict[str, str], failure: Any) -> None:
    """The note a rank killed by a signal could not write (a drill's own note stays)."""
    if (RunDir(run_dir).failures / f"{failure.pid}.json").exists():
        return
    try:
        name = signal.Signals(-failure.exitcode).name
    except ValueError:
        name = f"signal {-failure.exitcode}"
    rank = int(env.get("RANK", failure.local_rank))
    attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", 0))
    write_note(run_dir, rank, None, None, signal=name, pid=failure.pid, attempt=attempt)
