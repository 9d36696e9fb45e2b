"""What a start that ends before its workers leaves behind (dtrain_cli/cli/launch_cmd.py,
``start_workers``): nothing of a run dir it created, a script's included."""

from __future__ import annotations

import pytest
import typer

import dtrain_cli.launch.local as local
from dtrain_cli.cli.launch_cmd import start_workers
from dtrain_cli.config.compose import compose_config
from dtrain_cli.plan.build import build_plan


@pytest.mark.parametrize("script_fresh", [True, False])
def test_ctrl_c_before_a_scripts_workers_start_leaves_no_run_dir(
    tmp_path, monkeypatch, script_fresh
):
    """It kept config.yaml, plan.yaml and an empty logs/ for each Ctrl-C; a script's run
    dir that existed before (its checkpoints may be there) stays."""
    cfg = compose_config("gpt_tiny", [])
    plan = build_plan(cfg)
    run_dir = tmp_path / "runs" / "script-1"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.yaml").write_text("{}")
    monkeypatch.setattr(local, "prepare_workers", lambda *a: None)
    monkeypatch.setattr(local, "launch_local", lambda *a, **k: local.STOPPED_BEFORE_START)
    with pytest.raises(typer.Exit) as done:
        start_workers(run_dir, cfg, plan, script_fresh=script_fresh)
    assert done.value.exit_code == 130
    assert run_dir.exists() is not script_fresh
