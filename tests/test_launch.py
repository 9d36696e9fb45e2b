"""Real launches through `dtrain launch` (elastic agent, gloo, CPU): the math and the outputs."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from dtrain_cli.plan.plan import Plan
from tests.conftest import run_dtrain

pytestmark = pytest.mark.multiproc


def losses(run) -> list[float]:
    return [r["loss"] for r in run.metrics()]


def test_dp2_loss_curve_equals_single_process(run_dp1, run_dp2):
    one, two = losses(run_dp1), losses(run_dp2)
    assert len(one) == len(two) == 10
    for step, (a, b) in enumerate(zip(one, two, strict=True), start=1):
        assert abs(a - b) <= 1e-5 * abs(a), f"step {step}: dp=1 {a} vs dp=2 {b}"
    assert one[-1] < one[0]  # it learns


def test_dp2_replicas_identical_and_equal_to_single_process(run_dp1, run_dp2):
    s1, s2 = run_dp1.summary(), run_dp2.summary()
    assert s2["replicas_identical"] is True
    assert s2["param_sum"] == pytest.approx(s1["param_sum"], rel=1e-5)
    assert s2["param_sq_sum"] == pytest.approx(s1["param_sq_sum"], rel=1e-5)
    assert s2["val_loss"] == pytest.approx(s1["val_loss"], rel=1e-5)


def test_run_dir_holds_config_plan_and_logs(run_dp2):
    d = run_dp2.run_dir
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    assert cfg["parallel"]["dp"] == 2 and cfg["train"]["steps"] == 10
    plan = Plan.load(d / "plan.yaml")
    assert plan.world_size == 2 and plan.batch.grad_accum == 1
    for rank in (0, 1):
        text = (d / "logs" / f"rank_{rank}.log").read_text()
        coords = json.loads(re.search(r"mesh coordinates (\{.*\})", text).group(1))
        assert {"rank": rank, **coords} == plan.rank_table()[rank]  # runtime mesh == plan
    assert "step 10/10" in (d / "logs" / "rank_0.log").read_text()


def test_metrics_jsonl_and_tensorboard_agree(run_dp2):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, val = run_dp2.metrics("train"), run_dp2.metrics("val")
    assert [r["step"] for r in train] == list(range(1, 11))
    assert [r["step"] for r in val] == [5, 10]
    acc = EventAccumulator(str(run_dp2.run_dir / "tb"))
    acc.Reload()
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_ms"):
        events = acc.Scalars(f"train/{key}")
        assert [e.step for e in events] == list(range(1, 11))
        for e, r in zip(events, train, strict=True):
            assert e.value == pytest.approx(r[key], rel=1e-6)
    assert [e.value for e in acc.Scalars("val/val_loss")] == pytest.approx(
        [r["val_loss"] for r in val], rel=1e-6
    )


def test_lr_follows_the_plan(run_dp2):
    plan = Plan.load(run_dp2.run_dir / "plan.yaml")
    for r in run_dp2.metrics():
        assert r["lr"] == pytest.approx(plan.lr.lr_at(r["step"] - 1))


def test_console_shows_progress_and_summary(run_dp2):
    assert "step 10/10" in run_dp2.stdout and "run summary" in run_dp2.stdout
    assert "done:" in run_dp2.stdout


def test_console_summary_fits_a_screen_and_summary_json_keeps_every_field(run_dp2):
    out = run_dp2.stdout
    block = out[out.index("run summary") : out.index("done:")].splitlines()
    assert len(block) <= 15, "\n".join(block)
    text = "\n".join(block)
    s = run_dp2.summary()
    for label, value in (
        ("final loss", f"{s['final_loss']:.4f}"),
        ("val loss", f"{s['val_loss']:.4f}"),
        ("tokens/s", f"{s['tokens_per_s']:,.0f}"),
        ("wall time", f"{s['train_wall_s']:,.1f} s"),
    ):
        row = next(line for line in block if label in line)
        assert value in row, row
    assert str(run_dp2.run_dir) in out[out.index("run summary") :]
    assert "summary.json" in text and "metrics.jsonl" in text
    assert "param_digest" not in text and "startup_" not in text
    for key in (
        "final_loss",
        "val_loss",
        "tokens_per_s",
        "train_wall_s",
        "param_sum",
        "param_sq_sum",
        "param_digest",
        "replicas_identical",
        "memory_params_bytes",
        "comm_bytes_per_step_estimate",
        "startup_phases_s",
        "startup_first_step_done_s",
        "data_wait_ms_per_step",
    ):
        assert key in s, key


@pytest.mark.parametrize("mode", ["off", "bar"])
def test_progress_modes(mode, tmp_path):
    """off: no step lines on the console (the rank's log keeps them); bar: its last state is
    drawn before the summary, not after it."""
    run = run_dtrain(
        [
            "launch",
            "recipe=gpt_tiny",
            "model.n_layer=1",
            "train.steps=3",
            "logging.every=1",
            "optim.warmup_steps=1",
            "train.eval_every=0",
            "logging.tensorboard=false",
            f"logging.progress={mode}",
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "step 3/3" in (run.run_dir / "logs" / "rank_0.log").read_text()
    if mode == "off":
        assert "step 1/3" not in run.stdout and "step 3/3" not in run.stdout, run.stdout
    else:
        assert "step 3/3" in run.stdout
        assert run.stdout.rindex("step 3/3") < run.stdout.index("run summary"), run.stdout
    assert "run summary" in run.stdout


def test_startup_breakdown_adds_up_to_the_first_step(run_dp2):
    """The phases in summary.json run from the command's start to the end of step 1."""
    s = run_dp2.summary()
    phases = s["startup_phases_s"]
    assert list(phases) == [
        "compose",
        "agent",
        "rendezvous+start",
        "process_group",
        "model+data+optim",
        "step_1",
    ]
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(s["startup_first_step_done_s"], abs=0.01)
    line = next(
        x
        for x in run_dp2.stderr.splitlines() + run_dp2.stdout.splitlines()
        if "first step done" in x
    )
    assert "compose" in line and "step_1" in line
