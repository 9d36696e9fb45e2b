"""Every worker that had already died when torch's agent noticed a failure, not only one.

    dtrain launch recipe=gpt_tiny dp=2     # kill -9 rank 1: "rank 1 was killed by SIGKILL"

torch's agent polls its workers (``MultiprocessContext._poll``, every
``launcher.monitor_interval_s``); ``torch.multiprocessing.ProcessContext.join`` takes the
first ready process in its list as *the* failure, then ends the rest. A rank killed by a
signal (an OOM kill, ``kill -9``) and the peer that then lost it are often both dead at the
same poll: the peer, lower in the list, was reported, and the killed rank, its exit status
known to its ``Process`` object, was reported as having ended without an error
(:mod:`.failures`: "killed by a signal?"). While the agent runs, :func:`every_failed_process`
adds to the poll's failures every other process that had exited non-zero by itself (not by
the agent's SIGTERM to the rest); :mod:`.failures` then picks the cause by time and kind.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def every_failed_process() -> Iterator[None]:
    """``MultiprocessContext._poll`` reporting every worker that failed by itself."""
    from torch.distributed.elastic.multiprocessing import api

    original = api.MultiprocessContext._poll

    def _poll(self: Any) -> Any:
        result = original(self)
        if result is None or not result.failures or getattr(self, "_pc", None) is None:
            return result
        for local_rank, proc in enumerate(self._pc.processes):
            code = proc.exitcode
            if local_rank in result.failures or code in (None, 0, -signal.SIGTERM):
                continue  # running, done, or ended by the agent after the failure
            result.failures[local_rank] = api.ProcessFailure(
                local_rank=local_rank,
                pid=proc.pid,
                exitcode=code,
                error_file=self.error_files[local_rank],
            )
        return result

    api.MultiprocessContext._poll = _poll  # type: ignore[method-assign]
    try:
        yield
    finally:
        api.MultiprocessContext._poll = original  # type: ignore[method-assign]
