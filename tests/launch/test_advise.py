"""``dtrain advise --apply``: what it prints launches as printed. The rules, bad input and
--json without a launch: tests/unit/test_advise.py."""

from __future__ import annotations

import shlex

import pytest
import yaml

from tests.conftest import run_dtrain
from tests.unit.test_advise import _cli


@pytest.mark.multiproc
def test_apply_output_launches_as_printed(tmp_path):
    advice_args = [
        "recipe=gpt_tiny",
        "hardware=cpu",
        "train.steps=2",
        "train.global_batch_size=8",
        "checkpoint.at_end=false",
        "train.eval_every=0",
        "train.eval_batches=1",
        "logging.tensorboard=false",
    ]
    r = _cli(*advice_args, "--apply")
    assert r.exit_code == 0, r.output
    printed = shlex.split(r.output)
    assert "recipe=gpt_tiny" in printed and "train.steps=2" in printed
    run = run_dtrain(["launch", *printed], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    plan = yaml.safe_load((run.run_dir / "plan.yaml").read_text())
    want = dict(x.split("=", 1) for x in printed)
    shape = dict(zip(plan["mesh"]["dim_names"], plan["mesh"]["shape"], strict=True))
    assert shape == {k: int(want[f"parallel.{k}"]) for k in ("pp", "dp", "tp")}
    assert plan["strategy"] == want["parallel.strategy"]
    assert plan["batch"]["micro_batch_size"] == int(want["train.micro_batch_size"])
    assert run.summary()["steps"] == 2
