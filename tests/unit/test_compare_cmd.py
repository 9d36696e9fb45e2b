"""``dtrain compare``: beside the losses, each run's steady speed; a comparison of models of
different sizes is said (a user compared gpt_tiny with cnn_bn without a word, and had no
way to rank two runs by speed)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dtrain_cli.cli.app import app


def _run(path: Path, tokens_per_s: float, params: int) -> Path:
    path.mkdir(parents=True)
    (path / "plan.yaml").write_text("recipe: gpt_tiny\n")
    rows = [{"kind": "train", "step": s, "loss": 5.0 - s / 10} for s in (10, 20)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"tokens_per_s": tokens_per_s, "params": params}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_compare_says_each_runs_speed_against_the_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = _run(tmp_path / "a", 20000.0, 1000), _run(tmp_path / "b", 13000.0, 1000)
    result = CliRunner().invoke(app, ["compare", "a", "b"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    said = "speed (steady median, summary.json): a 20,000 tokens/s, b 13,000 tokens/s (0.65x a)"
    assert said in result.stdout
    assert "warning" not in result.stderr
    assert a.is_dir() and b.is_dir()


def test_compare_of_models_of_different_sizes_is_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "a", 20000.0, 875264), _run(tmp_path / "b", 9000.0, 5514)
    result = CliRunner().invoke(app, ["compare", "a", "b"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert " ".join(result.stderr.split()) == (
        "warning: the runs train models of different sizes (5,514, 875,264 parameters): "
        "their losses differ by model, not only by setting"
    )


def test_a_run_that_stopped_early_a_val_loss_apart_and_other_settings_are_said(
    tmp_path, monkeypatch
):
    """A run that died at step 2 of 4 compared 'no step diverges' (exit 0) on its one common
    step; val loss was never compared; runs of other steps or precisions were compared as if
    only their layout differed (a new user's finds)."""
    monkeypatch.chdir(tmp_path)
    a, b = _run(tmp_path / "a", 20000.0, 1000), _run(tmp_path / "b", 20000.0, 1000)
    (b / "summary.json").unlink()  # b stopped: no summary
    result = CliRunner().invoke(app, ["compare", "a", "b"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "warning: b: no summary.json: it did not finish (last logged step 20)" in " ".join(
        result.stderr.split()
    )
    (b / "summary.json").write_text(json.dumps({"params": 1000}))
    for run, val, steps in ((a, 4.0, 8), (b, 4.1, 16)):
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"kind": "val", "step": 20, "val_loss": val}) + "\n")
        (run / "config.yaml").write_text(
            f"train:\n  steps: {steps}\n  micro_batch_size: {steps}\nparallel:\n  dp: 2\n"
        )
    result = CliRunner().invoke(app, ["compare", "a", "b"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "val loss at 1 common step(s): max rel diff 2.439e-02 at step 20 (> 0.0001)" in (
        result.stdout
    )
    said = " ".join(result.stderr.split())
    assert "warning: the runs differ beyond the layout: train.steps 8 | 16" in said
    assert "micro_batch_size" not in said  # a layout setting
