"""Issue 14 without launching: the hang report's wording, spike and straggler rules. The
CLI's bad input, report, compare and env as a subprocess: tests/launch/test_diagnose_unit.py."""

from __future__ import annotations

import json
import math

import pytest

from dtrain_cli.launch.hang_report import hang_report


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


def test_a_straggler_is_named_when_slow_in_two_windows_running():
    """One window's own times subtract DDP's one sampled step's exposed communication: a
    user saw 'straggler' in 5 of 35 healthy runs (a save's window, the short last one)."""
    from dtrain_cli.runtime.components.metrics import TrainMetrics

    m = object.__new__(TrainMetrics)  # note_ranks' state alone
    m.rank_rows, m.straggler_counts, m.slow_before, m.ranks_before = [], {}, set(), 0
    m.window_steps, m.first_step, m.straggler_factor = 10, 1, 1.5

    def window(step: int, own_ms: list[float]) -> list[int]:  # [step, data, compute] a rank
        return m.note_ranks(step, [x for ms in own_ms for x in (ms, 0.0, ms)])

    assert window(20, [100.0, 165.0]) == []  # once: not named
    assert window(30, [100.0, 101.0]) == []
    assert window(40, [100.0, 900.0]) == []
    assert window(50, [100.0, 880.0]) == [1]  # twice running: named, and counted
    assert m.straggler_counts == {1: 1} and len(m.rank_rows) == 4


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


def test_a_pipelines_summary_shows_its_bubble_measured_and_in_theory():
    """The guide says the run summary reports the measured bubble next to the plan's: only
    summary.json had it (a new user's find)."""
    import io

    from rich.console import Console

    from dtrain_cli.runtime.components.sinks import summary_table

    out = io.StringIO()
    summary = {"steps": 8, "bubble_theory": 0.2, "bubble_measured": 0.2637}
    Console(file=out, width=100).print(summary_table(summary))
    assert "26% measured, 20% in theory (the plan's)" in out.getvalue()
    out = io.StringIO()
    Console(file=out, width=100).print(summary_table({"steps": 8}))
    assert "bubble" not in out.getvalue()


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
    assert "(unit/test_diagnose_unit.py:" in console  # where it was called from


def test_a_hang_outside_dtrains_collectives_names_the_ranks_in_the_earliest_step(tmp_path):
    """The hang drill at logging.every=10: rank 0 waits in DDP's gradient all-reduce of
    step 4, rank 1 froze in step 3; neither is in a collective of dtrain's own. It said
    'no rank made progress ... at step(s) 3, 4', naming no rank behind."""
    hang = tmp_path / "logs" / "hang"
    hang.mkdir(parents=True)
    ahead = record(0, 0, False, "graph.py:979 in _engine_run_backward") | {"step": 4}
    frozen = record(1, 0, False, "faults.py:92 in maybe_fail") | {"step": 3}
    for r in (ahead, frozen):
        (hang / f"rank_{r['rank']}.json").write_text(json.dumps(r))
    assert hang_report(tmp_path, 2) == (
        "hang: rank 1 stopped in step 3 (rank 1 at faults.py:92 in maybe_fail); rank 0 went on "
        "to step 4 and waited there for 60 s (rank 0 at graph.py:979 in _engine_run_backward); "
        f"stacks in {hang}/"
    )
    frozen["step"] = 4
    (hang / "rank_1.json").write_text(json.dumps(frozen))
    assert hang_report(tmp_path, 2).startswith("hang: no rank made progress for 60 s in step 4")
