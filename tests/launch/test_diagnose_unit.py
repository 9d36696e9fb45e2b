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


def test_env_prints_versions_backends_and_json(tmp_path):
    run = run_dtrain(["env"], tmp_path, env={"NCCL_DEBUG": "INFO"})
    assert run.returncode == 0
    assert "torch 2." in run.stdout and "gloo" in run.stdout and "NCCL_DEBUG=INFO" in run.stdout
    info = json.loads(run_dtrain(["env", "--json"], tmp_path).stdout)
    assert info["backends"]["gloo"] is True and info["packages"]["torch"].startswith("2.")
    assert info["env"]["DTRAIN_CACHE"]
