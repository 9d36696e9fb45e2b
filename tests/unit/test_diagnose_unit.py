"""Issue 14 without launching: the hang report's wording, spike and straggler rules. The
CLI's bad input, report, compare and env as a subprocess: tests/launch/test_diagnose_unit.py."""

from __future__ import annotations

import json

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
