"""``debug.profile_steps=[a,b]``: a torch.profiler trace of steps a..b on every rank.

    dtrain launch recipe=gpt_small dp=2 debug.profile_steps=[20,22]
    # -> runs/<run>/profile/rank_<k>.trace.json (open in https://ui.perfetto.dev or
    #    chrome://tracing); gloo/NCCL collectives show as their own events

CPU activity always, CUDA when the run is on GPUs; each step a ``ProfilerStep#<step>`` span
(Perfetto and TensorBoard's profile plugin show the step boundaries). Outside the profiled
steps the loop only compares two integers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from dtrain_cli.rundir.layout import RunDir

log = logging.getLogger("dtrain")


class Profiler:
    def __init__(self, steps: list[int], run_dir: Path, rank: int, device: torch.device) -> None:
        self.first, self.last = (steps[0], steps[1]) if steps else (0, -1)
        self.path = RunDir(run_dir).profile_trace(rank)
        self.device = device
        self._prof: Any = None
        self._step: Any = None  # the running step's span

    def step_begins(self, step: int) -> None:
        """``step``: the step about to run (1-based)."""
        if step == self.first and self._prof is None:
            from torch.profiler import ProfilerActivity, profile

            # kineto's own start/stop lines ("USDT: ... profiler_start") went to the console
            # of every rank; KINETO_LOG_LEVEL set by you is kept
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._prof = profile(activities=activities, record_shapes=False)
            self._prof.__enter__()
        if self._prof is not None:  # each step a span, named as torch's scheduled steps are
            self._step = torch.profiler.record_function(f"ProfilerStep#{step}")
            self._step.__enter__()

    def step_ends(self, step: int) -> None:
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
        if self._prof is not None and step >= self.last:
            self.close()

    def close(self) -> None:
        if self._step is not None:  # a step that ended by an error
            self._step.__exit__(None, None, None)
            self._step = None
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))
        log.info("profile of steps %d-%d: %s", self.first, self.last, self.path)
