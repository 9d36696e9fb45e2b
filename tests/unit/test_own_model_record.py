"""What the plan measured of a model of your own, from the data cache
(models/custom/record.py): a hit gives the same plan without building the model, a changed
source file or argument is a miss, and the checks that need the model still run on a hit."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap

import pytest

from dtrain_cli.config.compose import compose_config
from dtrain_cli.errors import ConfigError
from dtrain_cli.models.custom import record, spec
from dtrain_cli.plan.build import build_plan

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Unit(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.up = nn.Linear(width, {mult} * width)
            self.down = nn.Linear({mult} * width, width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    class Net(nn.Module):
        def __init__(self, vocab_size=256, block_size=32, width=16, depth=2):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, width)
            self.units = nn.ModuleList(Unit(width) for _ in range(depth))
            self.head = nn.Linear(width, vocab_size)

        def forward(self, x):
            h = self.embed(x)
            for unit in self.units:
                h = unit(h)
            return self.head(h)
    """
)


@pytest.fixture
def own(tmp_path, monkeypatch):
    """A model file in its own folder (the run's import root) and an empty data cache."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "recnet.py").write_text(MODEL.format(mult=4))
    monkeypatch.setenv("DTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(spec, "_RECORDS", {})
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("recnet", None)


def _cfg(folder, *more: str):
    over = ["model=custom", "model._target_=recnet.Net", "model.block_size=32", "dp=2", *more]
    cfg = compose_config("gpt_tiny", over)
    cfg.run.import_roots = [str(folder)]
    return cfg


def _records(folder) -> list:
    return sorted((folder.parent / "cache" / record.FOLDER).glob("*.json"))


def _new_process(monkeypatch) -> None:
    """What a second `dtrain plan` starts with: no record in memory, the model not built."""
    spec._RECORDS.clear()

    def no_build(self):
        raise AssertionError("built the model although the record was there")

    monkeypatch.setattr(spec.CustomSpec, "meta_model", no_build)


def test_a_recorded_plan_is_the_measured_one_and_builds_nothing(own, monkeypatch):
    measured = build_plan(_cfg(own, "parallel.strategy=fsdp"))
    (path,) = _records(own)
    _new_process(monkeypatch)
    again = build_plan(_cfg(own, "parallel.strategy=fsdp"))
    assert again.estimates == measured.estimates
    units = 2 * (16 * 64 + 64 + 64 * 16 + 16)
    assert again.estimates.num_params == 256 * 16 + units + 16 * 256 + 256
    assert again.estimates.activations_estimated
    assert _records(own) == [path]


def test_the_checks_that_need_the_model_run_on_a_hit(own, monkeypatch):
    """``parallel.fsdp_units`` is in the key (the blocks the plan counts when no layer
    list is named): each choice is measured once, and checked again on every hit."""
    for units in ("[Unit]", "[Block]"):
        with contextlib.suppress(ConfigError):
            build_plan(_cfg(own, "parallel.strategy=fsdp", f"parallel.fsdp_units={units}"))
    _new_process(monkeypatch)
    build_plan(_cfg(own, "parallel.strategy=fsdp", "parallel.fsdp_units=[Unit]"))
    with pytest.raises(ConfigError) as err:
        build_plan(_cfg(own, "parallel.strategy=fsdp", "parallel.fsdp_units=[Block]"))
    assert "parallel.fsdp_units=['Block']: no module of those classes in recnet.Net" in str(
        err.value
    )


def test_an_edited_model_file_or_argument_is_measured_again(own, monkeypatch):
    before = build_plan(_cfg(own)).estimates.num_params
    (own / "recnet.py").write_text(MODEL.format(mult=2))  # the user edits the model
    st = os.stat(own / "recnet.py")
    os.utime(own / "recnet.py", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    sys.modules.pop("recnet", None)
    spec._RECORDS.clear()
    after = build_plan(_cfg(own)).estimates.num_params
    assert after == before - 2 * (2 * 16 * 32 + 32)  # the MLPs are half as wide
    assert len(_records(own)) == 1  # same key: the record was replaced
    spec._RECORDS.clear()
    wider = build_plan(_cfg(own, "model.width=32")).estimates.num_params
    assert wider > after and len(_records(own)) == 2  # another argument, another record


def test_a_model_imported_from_outside_the_import_roots_is_still_watched(own, monkeypatch):
    """The model's own package is watched wherever it is installed (an installed package,
    a folder on PYTHONPATH that is no import root): editing it is a miss, not a stale hit."""
    before = build_plan(_cfg(own)).estimates.num_params
    elsewhere = own.parent / "elsewhere"  # the run's only import root: not where recnet is
    elsewhere.mkdir()
    cfg = _cfg(own)
    cfg.run.import_roots = [str(elsewhere)]
    spec._RECORDS.clear()
    assert build_plan(cfg).estimates.num_params == before
    (own / "recnet.py").write_text(MODEL.format(mult=2))
    st = os.stat(own / "recnet.py")
    os.utime(own / "recnet.py", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    sys.modules.pop("recnet", None)
    spec._RECORDS.clear()
    cfg = _cfg(own)
    cfg.run.import_roots = [str(elsewhere)]
    assert build_plan(cfg).estimates.num_params == before - 2 * (2 * 16 * 32 + 32)


def test_a_measurement_whose_loss_did_not_import_is_not_recorded(own, monkeypatch):
    """A loss module with a syntax error: the plan refuses it and keeps no record, so the
    fixed module's activations are measured (not 'not estimated' from a stale record)."""
    (own / "recloss.py").write_text("def fn(outputs, targets:\n")
    with pytest.raises(ConfigError):
        build_plan(_cfg(own, "train.loss=recloss.fn"))
    assert _records(own) == []
    (own / "recloss.py").write_text(
        "import torch.nn.functional as F\n\n"
        "def fn(outputs, targets):\n"
        "    return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())\n"
    )
    sys.modules.pop("recloss", None)
    spec._RECORDS.clear()
    plan = build_plan(_cfg(own, "train.loss=recloss.fn"))
    assert plan.estimates.activations_estimated and len(_records(own)) == 1
