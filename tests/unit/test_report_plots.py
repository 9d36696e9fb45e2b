"""`dtrain report` on a run resumed at another world size: its metrics log two ranks' times,
then one; the per-rank plot ended in an IndexError traceback."""

from __future__ import annotations

from pathlib import Path

from dtrain_cli.report.plots import report_plots
from dtrain_cli.report.runs import RunData


def _row(step: int, world: int) -> dict:
    return {
        "kind": "train",
        "step": step,
        "loss": 5.0 - step / 10,
        "lr": 1e-3,
        "tokens_per_s": 1000.0,
        "step_time_ms": 100.0,
        "rank_step_ms": [100.0 + r for r in range(world)],
        "rank_compute_ms": [90.0 + r for r in range(world)],
        "rank_data_ms": [1.0] * world,
    }


def test_per_rank_plot_of_a_run_resumed_on_fewer_and_more_ranks(tmp_path):
    rows = [_row(s, 2) for s in (1, 2, 3)] + [_row(s, 1) for s in (4, 5)]
    rows += [_row(s, 4) for s in (6, 7)]
    paths = report_plots(RunData(path=tmp_path, records=rows), tmp_path / "report")
    names = sorted(p.name for p in paths if p is not None)
    assert "ranks.png" in names and "step_breakdown.png" in names
    for p in paths:
        if p is not None:
            assert p.stat().st_size > 1000  # a PNG was drawn


def test_the_wall_time_of_a_resumed_run_says_it_is_the_last_segments():
    """summary.json's train_wall_s is the segment since the resume; the report said
    "train wall time, s: 0.7" for a run that trained twice as long."""
    from dtrain_cli.report.runs import summary_text

    rows = [_row(s, 2) for s in (1, 2, 3)]
    run = RunData(path=Path("r"), records=rows, summary={"train_wall_s": 0.7})
    assert "train wall time, s: 0.7\n" in summary_text(run)
    run.summary["resumed_from"] = "step_000002"
    assert "train wall time, s (since the resume from step_000002): 0.7" in summary_text(run)


def test_report_of_a_script_run_says_dtrain_saw_no_steps(tmp_path):
    """A finished ``dtrain run`` of one's own script was 'no metrics.jsonl yet (the run
    logged no step)', as if waiting would help."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    (tmp_path / "plan.yaml").write_text("script:\n  path: train.py\n  module: null\n")
    (tmp_path / "finished.json").write_text('{"exit_code": 0}')
    result = CliRunner().invoke(app, ["report", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert " ".join(result.stderr.split()) == (
        f"error: {tmp_path}: a run of your own script (train.py), whose steps dtrain does not "
        "see; its ranks' output is in logs/rank_<k>.log"
    )


def test_a_file_of_a_run_is_told_to_give_its_folder(tmp_path):
    """`dtrain compare runs/a runs/a/metrics.jsonl` said 'no such folder' of a path that
    exists."""
    import pytest

    from dtrain_cli.report.runs import RunDirError, load_run

    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunDirError) as err:
        load_run(tmp_path / "metrics.jsonl")
    assert str(err.value) == f"{tmp_path / 'metrics.jsonl'}: a file; give its run dir ({tmp_path})"


def test_the_breakdown_counts_ddps_sampled_micro_batch_for_each_of_the_step(tmp_path):
    """With 4 micro-batches a step, forward and backward were one micro-batch's (a quarter
    of the step) plotted as 'ms per step'; the exposed communication is the last one's."""
    from dtrain_cli.report.plots import breakdown_layers

    (tmp_path / "plan.yaml").write_text("batch:\n  grad_accum: 4\n")
    row = {"kind": "train", "step": 10, "step_time_ms": 110.0, "forward_ms": 8.0}
    row |= {"backward_compute_ms": 17.0, "comm_exposed_ms": 5.0, "rank_data_ms": [0.5]}
    title, layers = breakdown_layers(RunData(path=tmp_path, records=[row]))
    assert dict(layers) == {
        "forward": [32.0],
        "backward compute": [68.0],
        "exposed communication": [5.0],
        "data wait": [0.5],
    }
    assert title.endswith("x 4 micro-batches)")
