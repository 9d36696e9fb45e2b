"""Your own model's bad inputs (examples/my_models/net.py through the seam), refused by
``dtrain plan`` before any worker starts: one line, exit 2, nothing written. The launches
under every layout: tests/launch/test_own_model.py."""

from __future__ import annotations

import os

import pytest

from tests.conftest import REPO

EXAMPLES = REPO / "examples"
ENV = {
    "PYTHONPATH": os.pathsep.join(
        [str(EXAMPLES), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    )
}
# 4 steps of 8 samples; dp=1 accumulates 2 micro-batches of 4 (as dp=2 runs one each).
OWN = [
    "recipe=my_experiment",
    "--config-dir",
    str(EXAMPLES / "conf"),
    "train.steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "logging.every=1",
    "train.eval_every=0",
    "logging.tensorboard=false",
    "debug.replica_check_at_end=true",  # param_digest
]


def plan_error(tmp_path, monkeypatch, *overrides: str) -> str:
    """``dtrain plan`` in-process (the CLI's own entry point; torch imported once for all
    cases, not once per case): exit 2, one line, no exception, nothing written."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(tmp_path)
    for path in reversed(ENV["PYTHONPATH"].split(os.pathsep)):
        if path:
            monkeypatch.syspath_prepend(path)
    result = CliRunner().invoke(app, ["plan", *OWN, *overrides])
    assert result.exit_code == 2, f"expected exit 2:\n{result.output}"
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert not (tmp_path / "runs").exists()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model._target_=no_such_pkg.Net"], "no module 'no_such_pkg'"),
        (["model._target_=os.system"], "standard library"),
        (["model._target_=own_targets.not_a_module"], "returned dict, not a torch.nn.Module"),
        (["model._target_=my_models.net.Nope"], "has no attribute 'Nope'"),
        (["model.colour=3"], "model._target_=my_models.net.Net"),
        (["tp=2"], "has no tensor-parallel plan; give one with parallel.tp_plan"),
        (["pp=2"], "name its layer list with pipeline.layers"),
        (["pp=2", "pipeline.layers=body"], "pipeline.layers=body"),
        (["tp=2", "parallel.tp_plan={trunk.*.up:diagonal}"], "unknown style"),
        (["train.loss=os.path.join"], "standard library"),
        (["train.loss=huber"], "train.loss=huber: not allowed"),
        (["parallel=fsdp", "dp=2", "parallel.fsdp_units=[Block]"], "no module of those classes"),
    ],
)
def test_bad_own_model_input_is_one_line_before_anything_starts(
    tmp_path, monkeypatch, overrides, expected
):
    assert expected in plan_error(tmp_path, monkeypatch, *overrides)
