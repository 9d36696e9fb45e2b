"""Start-up with processes: the worker module leaves heavy torch modules unimported (a fresh
interpreter), and a failed launch leaves no fork server. The preload lists:
tests/unit/test_startup.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DTRAIN, cache_dir


def test_worker_module_leaves_heavy_torch_modules_unimported():
    """The worker entry imports no DCP, pipelining, DTensor or torch._dynamo by itself: a
    run imports them when its plan uses them (a DDP run needs none of the first three
    before its first step)."""
    code = (
        "import sys, dtrain_cli.runtime.worker, dtrain_cli.launch.local\n"
        "heavy = ['torch.distributed.checkpoint', 'torch.distributed.pipelining',\n"
        "         'torch.distributed.tensor', 'torch._dynamo']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "recipe=gpt_tiny", "model.n_layer=-1"],  # a config error after the start
        ["launch", "recipe=gpt_tiny", "launcher.start_method=spawn", "model.n_layer=-1"],
    ],
)
def test_a_failed_launch_leaves_no_fork_server(tmp_path, args):
    """The fork server starts before the config is composed; when the launch fails it must
    not outlive the launcher (it would hold the launcher's stdout open, so a caller reading
    it, like this test, would wait forever)."""
    started = time.monotonic()
    proc = subprocess.run(
        [*DTRAIN, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DTRAIN_CACHE": str(cache_dir())},
    )
    assert proc.returncode == 2
    assert "model.n_layer" in proc.stderr
    assert time.monotonic() - started < 30
    assert _servers_started_in(tmp_path) == []


def _servers_started_in(folder) -> list[int]:
    """Fork servers whose command line names ``folder`` (their sys.path holds the cwd)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "multiprocessing.forkserver" in text and str(folder) in text:
            out.append(int(cmdline.parent.name))
    return out
