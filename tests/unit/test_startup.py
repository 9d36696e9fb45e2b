"""Start-up without a launch: what the launcher and the workers import before step 1 (the
preload lists follow the plan; every module named as a string resolves). The fork server's
hygiene and the worker module's imports in a fresh interpreter: tests/launch/test_startup.py."""

from __future__ import annotations

import types

import pytest

from dtrain_cli.config.compose import compose_config
from dtrain_cli.launch.preload import CHECKPOINT_MODULES, modules_before_first_step
from dtrain_cli.plan.build import build_plan


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


def test_the_composed_config_names_what_its_plan_will():
    """What the fork server is told before the plan exists (the layout's and the model
    kind's modules) is what the plan's list adds to the worker itself, for the layouts
    users write; a config the plan will refuse gets no list, not an error."""
    from dtrain_cli.launch.preload import WORKER_FIRST, modules_known_once_composed

    for recipe, layout in (
        ("gpt_tiny", ["dp=1"]),
        ("gpt_tiny", ["dp=2"]),
        ("gpt_tiny", ["tp=2"]),
        ("gpt_tiny", ["dp=2", "pp=2", "parallel.strategy=fsdp"]),
        ("gpt_tiny", ["dp=2", "parallel.strategy=zero1"]),
        ("llama_tiny_hf", ["dp=2"]),
    ):
        cfg = compose_config(recipe, layout)
        planned = modules_before_first_step(cfg, build_plan(cfg), False)
        assert [*WORKER_FIRST, *modules_known_once_composed(cfg)] == planned, layout
    bad = compose_config("gpt_tiny", ["dp=2"])
    bad.parallel.strategy = "no_such_strategy"
    assert modules_known_once_composed(bad) == []


def test_the_fork_server_imports_each_list_in_order_until_the_last(tmp_path, monkeypatch):
    """The launcher's lists (``worker_server.announce``) reach the server's preload in
    order; it imports each as it comes, stops after the one marked last, and removes them."""
    import json
    import os
    import sys

    from dtrain_cli.launch import preload_lists as lists

    base = str(tmp_path / "preload.json")
    (tmp_path / "preload.json.0").write_text(json.dumps({"modules": ["json"], "last": False}))
    (tmp_path / "preload.json.1").write_text(json.dumps({"modules": ["colorsys"], "last": True}))
    (tmp_path / "preload.json.2").write_text(json.dumps({"modules": ["sched"], "last": True}))
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    monkeypatch.delitem(sys.modules, "sched", raising=False)
    lists.import_announced_modules(base, os.getppid())
    assert "colorsys" in sys.modules and "sched" not in sys.modules
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preload.json.2"]


@pytest.mark.parametrize("lists", [[False], [False, True]], ids=["before-last", "after-last"])
def test_stopping_the_fork_server_leaves_no_list_behind(lists, tmp_path, monkeypatch):
    """A launch that ends before its server read what it was told (a refused plan, another
    start method, a failure or Ctrl-C while the server still imports torch) removes the
    lists: nothing of it stays in the temp folder. No real server or tracker is touched."""
    from multiprocessing import resource_tracker

    from dtrain_cli.launch import worker_server

    base = str(tmp_path / "preload.json")
    monkeypatch.setattr(worker_server, "_lists", base)
    monkeypatch.setattr(worker_server, "_announced", 0)
    monkeypatch.setattr(worker_server, "_last_sent", False)
    monkeypatch.setattr(worker_server, "_running", True)
    monkeypatch.setattr(worker_server.forkserver, "_forkserver", types.SimpleNamespace())
    monkeypatch.setattr(resource_tracker, "_resource_tracker", types.SimpleNamespace())
    for last in lists:
        worker_server.announce(["json"], last=last)
    assert len(list(tmp_path.iterdir())) == len(lists)
    if lists[-1]:
        worker_server.announce(["json"])  # after the last one: not written
        assert len(list(tmp_path.iterdir())) == len(lists)
    worker_server.stop()
    assert list(tmp_path.iterdir()) == []
