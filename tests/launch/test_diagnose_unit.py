"""Issue 14 without training, through ``python -m dtrain_cli``: bad debug input, report and
compare on made-up run dirs, dtrain env. The hang report's wording, spike and straggler
rules: tests/unit/test_diagnose_unit.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_dtrain

BAD = {
    "debug.profile_steps=[5,200]": "debug.profile_steps=[5, 200]: must be [first, last] with "
    "1 <= first <= last <= train.steps=100",
    "debug.collective_timeout_s=-1": "debug.collective_timeout_s=-1.0: must be >= 0",
    "train.on_nan=ignore": "train.on_nan=ignore: not allowed; choose one of stop, skip, rollback",
    "train.on_spike=yes": "train.on_spike=yes: not allowed; choose one of off, stop, skip,",
    "debug.straggler_factor=1": "debug.straggler_factor=1.0: must be > 1",
}


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
    """A run that stopped before the other's first logged step was told to pick
    logging.every values that divide each other (1 and 5 do)."""
    a, b = fake_run(tmp_path / "a", [1, 2, 3]), fake_run(tmp_path / "b", [10, 20])
    run = run_dtrain(["compare", str(a), str(b)], tmp_path)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert run.stderr.strip() == (
        f"error: no common logged steps in {a}, {b}: {a} logged only up to step 3; {b}'s "
        "first logged step is 10"
    )
    c, d = fake_run(tmp_path / "c", [3, 6, 9]), fake_run(tmp_path / "d", [4, 8])
    run = run_dtrain(["compare", str(c), str(d)], tmp_path)
    assert run.returncode == 2 and "compare runs whose logging.every divide" in run.stderr


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


def write_records(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "plan.yaml").write_text("recipe: x\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "summary.json").write_text(json.dumps({"steps": records[-1]["step"]}))  # finished
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
    for run_dir in (a, b):  # finished runs
        (run_dir / "summary.json").write_text(json.dumps({"steps": 3}))
    run = run_dtrain(["compare", str(a), str(b)], tmp_path, env={"COLUMNS": "60"})
    assert run.returncode == 0, run.stderr
    assert f"A = {a}" in run.stdout and f"B = {b}" in run.stdout
    head = next(line for line in run.stdout.splitlines() if "step" in line and "max" in line)
    assert " A " in head and " B " in head
    assert (tmp_path / "compare.png").is_file() and "plot: compare.png" in run.stdout
    assert not (a / "report").exists()
    other = run_dtrain(["compare", str(a), str(b), "--out", str(tmp_path / "x.png")], tmp_path)
    assert other.returncode == 0 and (tmp_path / "x.png").is_file()
