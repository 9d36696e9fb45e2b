"""Issue 14 without launching: bad input, the hang report's wording, spike and straggler
rules, dtrain env."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dtrain_cli.launch.hang_report import hang_report
from tests.conftest import run_dtrain

BAD = {
    "debug.profile_steps=[5,200]": "debug.profile_steps=[5, 200]: must be [first, last] with "
    "1 <= first <= last <= train.steps=100",
    "debug.collective_timeout_s=-1": "debug.collective_timeout_s=-1.0: must be >= 0",
    "train.on_nan=ignore": "train.on_nan=ignore: not allowed; choose one of stop, skip, rollback",
    "train.on_spike=yes": "train.on_spike=yes: not allowed; choose one of off, stop, skip,",
    "debug.straggler_factor=1": "debug.straggler_factor=1.0: must be > 1",
}
ROLLBACK = {  # issue 24 #11: a rollback needs a checkpoint to restore
    "train.on_nan=rollback": "train.on_nan=rollback: no checkpoint to roll back to "
    "(checkpoint.every_steps and checkpoint.every_minutes are 0); set "
    "checkpoint.every_steps=N, or train.on_nan=skip",
    "train.on_spike=rollback": "train.on_spike=rollback: no checkpoint to roll back to",
}


def test_rollback_without_a_checkpoint_cadence_is_refused_by_the_plan(tmp_path):
    run = run_dtrain(["plan", "recipe=gpt_tiny", *ROLLBACK], tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert len(lines) == 2, run.stderr
    for line, expected in zip(lines, ROLLBACK.values(), strict=True):
        assert line.startswith(f"error: {expected}"), line
    for cadence in ("checkpoint.every_steps=5", "checkpoint.every_minutes=10"):
        ok = run_dtrain(["plan", "recipe=gpt_tiny", *ROLLBACK, cadence], tmp_path)
        assert ok.returncode == 0, ok.stderr


def test_a_rollback_before_the_first_checkpoint_names_the_setting_and_no_step():
    """The launcher's report names the step ("failed after step 3"); the error names the
    policy that needed a checkpoint (not on_nan/on_spike) and no second step."""
    import re

    from dtrain_cli.config.schema import TrainConfig
    from dtrain_cli.runtime.components.numerics import NumericsError, NumericsPolicy

    policy = NumericsPolicy(TrainConfig(on_spike="rollback"), None, None, 1, True)
    policy.rollback_due, policy.rollback_why = True, ("spike", "a loss spike (41.2)")
    with pytest.raises(NumericsError) as err:
        policy.rolled_back(4, None)
    text = str(err.value)
    assert text.startswith("train.on_spike=rollback: a loss spike (41.2) before the run's first")
    assert not re.search(r"step \d", text) and "on_nan" not in text


def test_bad_debug_input_is_one_line_each_exit_2(tmp_path):
    run = run_dtrain(["plan", "recipe=gpt_tiny", *BAD], tmp_path)
    assert run.returncode == 2
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert len(lines) == len(BAD), run.stderr
    for expected in BAD.values():
        assert any(expected in line for line in lines), expected
    assert "Traceback" not in run.stderr
    single = run_dtrain(["plan", "recipe=gpt_tiny", "debug.profile_steps=[3]"], tmp_path)
    assert single.returncode == 2 and "debug.profile_steps=[3]: must be [first, last]" in (
        single.stderr
    )


def fake_run(path: Path, steps: list[int]) -> Path:
    path.mkdir(parents=True)
    (path / "plan.yaml").write_text("recipe: x\n")
    records = [{"step": s, "kind": "train", "loss": 5.0 - 0.1 * s} for s in steps]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_report_on_a_folder_that_is_not_a_run_dir(tmp_path):
    run = run_dtrain(["report", str(tmp_path)], tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"error: {tmp_path}: not a run dir (no plan.yaml); give a folder `dtrain launch` "
        "made, such as runs/<run>"
    ]
    assert not (tmp_path / "report").exists()


def test_compare_runs_without_common_steps(tmp_path):
    a, b = fake_run(tmp_path / "a", [1, 2, 3]), fake_run(tmp_path / "b", [10, 20])
    run = run_dtrain(["compare", str(a), str(b)], tmp_path)
    assert run.returncode == 2
    assert "no common logged steps" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_compare_names_the_first_step_over_the_tolerance(tmp_path):
    a, b = fake_run(tmp_path / "a", [1, 2, 3, 4]), fake_run(tmp_path / "b", [1, 2, 3, 4])
    lines = (b / "metrics.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    rec["loss"] *= 1.001
    lines[2] = json.dumps(rec)
    (b / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run = run_dtrain(["compare", str(a), str(b), "--tol", "1e-4"], tmp_path)
    assert run.returncode == 1
    assert "max rel diff 9.990e-04 at step 3; first divergent step 3 (> 0.0001)" in run.stdout


def write_records(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "plan.yaml").write_text("recipe: x\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_compare_aligns_runs_logged_at_different_every(tmp_path):
    """One training logged every step and every 4 steps (the loss a window mean): the same
    numbers, no divergence; the finer run's windows are merged, weighted by their steps
    (step 6 was skipped by the numerics policy: 1 counted step in its window of 2)."""
    losses = {s: 5.0 - 0.3 * s + 0.05 * (s % 3) for s in range(1, 11)}
    every1 = [{"step": s, "kind": "train", "loss": v, "loss_steps": 1} for s, v in losses.items()]
    every1[5]["loss_steps"], every1[5]["loss"] = 0, float("nan")  # step 6 skipped
    ends, rows, prev = [4, 8, 10], [], 0
    for end in ends:
        counted = [losses[s] for s in range(prev + 1, end + 1) if s != 6]
        rows.append({"step": end, "kind": "train", "loss": sum(counted) / len(counted)})
        rows[-1]["loss_steps"] = len(counted)
        prev = end
    a = write_records(tmp_path / "runs" / "gpt_tiny-every1", every1)
    b = write_records(tmp_path / "runs" / "gpt_tiny-every4", rows)
    run = run_dtrain(["compare", str(a), str(b), "--tol", "1e-9"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 common steps" in run.stdout and "no step diverges" in run.stdout
    assert "mean over the steps since the previous row" in run.stdout
    # older records without loss_steps: the window is the steps since the previous record
    for r in every1 + rows:
        r.pop("loss_steps")
    every1[5]["loss"] = losses[6]
    rows[1]["loss"] = sum(losses[s] for s in range(5, 9)) / 4
    c = write_records(tmp_path / "c", every1)
    d = write_records(tmp_path / "d", rows)
    assert run_dtrain(["compare", str(c), str(d), "--tol", "1e-9"], tmp_path).returncode == 0


def test_compare_names_alike_runs_apart_and_plots_where_asked(tmp_path):
    """Run names that share a long prefix get letters and a legend (not two identical
    truncated heads); the plot goes to ./compare.png or --out, never into a run dir."""
    name = "gpt_tiny-20250101-120000-dp2-accumulate"
    a = fake_run(tmp_path / "runs" / f"{name}-a", [1, 2, 3])
    b = fake_run(tmp_path / "runs" / f"{name}-b", [1, 2, 3])
    run = run_dtrain(["compare", str(a), str(b)], tmp_path, env={"COLUMNS": "60"})
    assert run.returncode == 0, run.stderr
    assert f"A = {a}" in run.stdout and f"B = {b}" in run.stdout
    head = next(line for line in run.stdout.splitlines() if "step" in line and "max" in line)
    assert " A " in head and " B " in head
    assert (tmp_path / "compare.png").is_file() and "plot: compare.png" in run.stdout
    assert not (a / "report").exists()
    other = run_dtrain(["compare", str(a), str(b), "--out", str(tmp_path / "x.png")], tmp_path)
    assert other.returncode == 0 and (tmp_path / "x.png").is_file()


def record(rank: int, count: int, inside: bool, where: str = "x.py:1 in f") -> dict:
    return {
        "rank": rank,
        "step": 7,
        "waited_s": 60.2,
        "timeout_s": 60,
        "where": where,
        "collective": {
            "count": count,
            "op": "all_reduce",
            "what": "logging",
            "step": 7,
            "inside": inside,
        },
    }


def test_hang_report_names_behind_waiting_and_missing_ranks(tmp_path):
    hang = tmp_path / "logs" / "hang"
    hang.mkdir(parents=True)
    recs = [record(0, 412, True), record(1, 412, True), record(2, 412, True)]
    recs.append(record(3, 411, False, "faults.py:9 in sleep"))
    for r in recs:
        (hang / f"rank_{r['rank']}.json").write_text(json.dumps(r))
    text = hang_report(tmp_path, 5)
    assert text == (
        "hang: rank 3 never joined all_reduce #412 (step 7, logging) (rank 3 at faults.py:9 "
        "in sleep); rank 4 wrote no record (exited or unresponsive); ranks 0-2 waited in it "
        f"for 60 s; stacks in {hang}/"
    )
    assert hang_report(tmp_path / "other", 2) is None


def test_spike_detector_needs_history_and_a_threshold():
    from dtrain_cli.runtime.components.numerics import SpikeDetector

    spikes = SpikeDetector(threshold=3.0, window=50)
    assert not spikes.is_spike(100.0)  # no history yet
    for loss in (4.0, 4.1, 3.9, 4.0, 4.2):
        spikes.accept(loss)
    assert not spikes.is_spike(11.9) and spikes.is_spike(12.1)


def test_stragglers_are_ranks_above_the_median_by_the_factor():
    from dtrain_cli.runtime.components.metrics import find_stragglers

    assert find_stragglers([100, 104, 98, 350], 1.5) == [3]
    assert find_stragglers([100, 104, 98, 140], 1.5) == []
    assert find_stragglers([420, 1218], 1.5) == [1]  # two ranks: against the other one
    assert find_stragglers([0.1, 0.3], 1.5) == []  # tiny steps: noise is not a straggler
    assert find_stragglers([100], 1.5) == []


def test_env_prints_versions_backends_and_json(tmp_path):
    run = run_dtrain(["env"], tmp_path, env={"NCCL_DEBUG": "INFO"})
    assert run.returncode == 0
    assert "torch 2." in run.stdout and "gloo" in run.stdout and "NCCL_DEBUG=INFO" in run.stdout
    info = json.loads(run_dtrain(["env", "--json"], tmp_path).stdout)
    assert info["backends"]["gloo"] is True and info["packages"]["torch"].startswith("2.")
    assert info["env"]["DTRAIN_CACHE"]
    from importlib import metadata

    for name in ("transformers", "datasets", "tokenizers", "safetensors"):
        assert info["packages"][name] == metadata.version(name)
        assert f"{name} {metadata.version(name)}" in run.stdout


def test_env_names_the_hugging_face_packages_that_are_missing():
    from dtrain_cli.cli.env_cmd import package_lines

    core, hf = package_lines(
        {
            "torch": "2.13.0",
            "numpy": None,
            "transformers": "5.0",
            "datasets": None,
            "tokenizers": None,
            "safetensors": "0.8",
        }
    )
    assert core == "torch 2.13.0"
    assert hf == (
        "transformers 5.0  datasets not installed  tokenizers not installed  safetensors 0.8"
    )


def test_a_summary_without_throughput_is_strict_json_and_says_not_measured(tmp_path):
    """Issue 24 #6: nothing but the first step ran (no window to measure): null in
    summary.json (NaN is not JSON), "not measured" on the console."""
    import io

    from rich.console import Console

    from dtrain_cli.runtime.components.sinks import summary_table, write_summary

    summary = {"steps": 1, "final_loss": 5.1, "tokens_per_s": float("nan"), "x": [math.inf]}
    write_summary(tmp_path, summary)
    text = (tmp_path / "summary.json").read_text()
    back = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {text}"))
    assert back["tokens_per_s"] is None and back["x"] == [None] and back["final_loss"] == 5.1
    out = io.StringIO()
    Console(file=out, width=100).print(summary_table(back))
    assert "not measured" in out.getvalue() and "nan" not in out.getvalue().lower()


def test_python_warnings_reach_the_rank_log_and_rank_0_console_once(tmp_path, monkeypatch):
    """Issue 24 #12: torch's warning of a scheduler stepped before its optimizer (a sign of
    a bug) goes to the rank's log and rank 0's console, once however often it repeats."""
    import io
    import logging
    import warnings

    import torch
    from rich.console import Console

    from dtrain_cli.runtime.diagnostics.logs import setup_logging

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    out = io.StringIO()
    setup_logging(tmp_path, 0, Console(file=out, width=300))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # even when every call warns: shown once
        for _ in range(3):
            sched.step()  # before optimizer.step()
    for handler in logging.getLogger("dtrain").handlers:
        handler.flush()
    said = "UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`"
    console = out.getvalue()
    log = (tmp_path / "logs" / "rank_0.log").read_text()
    assert console.count(said) == 1 and log.count(said) == 1, console
    assert "(tests/test_diagnose_unit.py:" in console  # where it was called from
