"""Start-up: what the launcher and the workers import before step 1, and the fork server
that does it (no launch here except the fork-server hygiene checks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain_cli.config.compose import compose_config
from dtrain_cli.launch.preload import CHECKPOINT_MODULES, modules_before_first_step
from dtrain_cli.plan.build import build_plan
from tests.conftest import DTRAIN, cache_dir


def _modules(*overrides: str, resuming: bool = False) -> list[str]:
    cfg = compose_config("gpt_tiny", list(overrides))
    return modules_before_first_step(cfg, build_plan(cfg), resuming)


def test_preload_follows_the_plan():
    assert _modules("dp=1") == ["dtrain_cli.runtime.worker"]  # one process: no DDP
    ddp = _modules("dp=2")
    assert "torch._dynamo" in ddp  # DistributedDataParallel's constructor imports it
    assert not set(CHECKPOINT_MODULES) & set(ddp)  # a fresh run saves later, not before step 1
    assert "dtrain_cli.runtime.parallel.pipeline" in _modules("pp=2")
    assert "torch.distributed.tensor.parallel" in _modules("tp=2")  # DTensor's TP API
    assert "torch.distributed.fsdp" in _modules("dp=2", "parallel.strategy=fsdp")
    assert set(CHECKPOINT_MODULES) <= set(_modules("dp=2", resuming=True))
    # the model's own modules (an HF model: transformers and its modeling module)
    cfg = compose_config("llama_tiny_hf", ["dp=2"])
    hf = modules_before_first_step(cfg, build_plan(cfg), False)
    assert {"transformers", "transformers.models.llama.modeling_llama"} <= set(hf)
    assert "transformers" not in _modules("dp=2")


def _every_module_name_written_as_a_string() -> list[str]:
    """The module paths the launcher names as strings: preload lists for every kind of
    plan, the fork server's first imports and preload module, the workers' entry points."""
    from dtrain_cli.launch import preload, worker_server

    names = [*worker_server.BASE_PRELOAD, *preload.WORKER_FIRST, *preload.SCRIPT_FIRST]
    names += [*preload.SCRIPT_PRELOAD, *preload.CHECKPOINT_MODULES]
    names += [*preload.TENSOR_PARALLEL_MODULES, *preload.PIPELINE_MODULES]
    for layout in (["dp=2"], ["tp=2"], ["pp=2"], ["dp=2", "parallel.strategy=fsdp"]):
        names += _modules(*layout, resuming=True)
    names += [*_modules("dp=2", "parallel.strategy=zero1"), *_modules("dp=2", "train.compile=true")]
    entries = (preload.WORKER_ENTRY, preload.SCRIPT_ENTRY, preload.CLUSTER_CHECK_ENTRY)
    return sorted({*names, preload.SCRIPT_MODULE, *(e.split(":")[0] for e in entries)})


def test_every_module_path_written_as_a_string_resolves():
    """A preload name that no longer exists is a speed-up silently lost (the fork server
    swallows the ImportError): every one must resolve, and every entry point exist."""
    import importlib
    import importlib.util

    from dtrain_cli.launch import preload

    missing = [n for n in _every_module_name_written_as_a_string() if not _found(n)]
    assert missing == []
    for entry in (preload.WORKER_ENTRY, preload.SCRIPT_ENTRY, preload.CLUSTER_CHECK_ENTRY):
        module, _, attr = entry.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), entry


def _found(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package that is not there
        return False


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
