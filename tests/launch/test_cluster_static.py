"""``dtrain launch``'s multi-node flag errors, in-process: exit 2, one line, nothing written.
In-process, but a launch starts its fork server before it checks: this room. The static
checks themselves: tests/unit/test_cluster_static.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app

runner = CliRunner()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nnodes", "3:2"], "parallel.nnodes=3:2: MIN is above MAX"),
        (["--nnodes", "1:2"], "pass the same --rdzv-id"),  # elastic: a multi-node run
        (["--nnodes", "2", "--rdzv-endpoint", "h:29500"], "pass the same --rdzv-id"),
        (["--nnodes", "2", "--rdzv-id", "x"], "need a fixed host:port"),
        # the node count as an override: named so (it said '--rdzv-endpoint=localhost:0'
        # and '--nnodes 2', neither of them typed)
        (["nnodes=2", "--rdzv-id", "x"], "error: nnodes=2: 2 nodes need a fixed host:port"),
        (["nnodes=2", "--rdzv-endpoint", "h:1"], "error: nnodes=2: every node must name"),
        (
            ["--nnodes", "2", "--rdzv-id", "x", "--rdzv-endpoint", "h:1", "--node-rank", "5"],
            "[0, 2)",
        ),
        (["cluster.signal=KILL"], "cluster.signal: signal 'KILL' is not supported; use one of"),
    ],
)
def test_launch_multinode_flag_errors_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["launch", "recipe=gpt_tiny", "dp=2", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()
