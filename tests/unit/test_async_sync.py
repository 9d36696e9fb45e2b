"""Issue 15 without launching: the parameter server's and DiLoCo's bad input, and how
parameters are sharded over servers. The launches: tests/launch/test_async_sync.py."""

from __future__ import annotations

import pytest

PS = ["sync.mode=param_server"]


def plan_refusal(*overrides: str) -> str:
    """``dtrain plan recipe=gpt_tiny dp=2 ...`` in-process: exit 2 with one line (returned)."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    result = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "dp=2", *overrides])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["sync.servers=0"], "sync.servers=0: must be >= 1"),
        (["sync.servers=500"], "sync.servers=500: the model has"),
        (["sync.max_staleness=-1"], "sync.max_staleness=-1: must be >= 0"),
        (["parallel.strategy=fsdp"], "does not combine with strategy=fsdp"),
        (["parallel.strategy=zero1"], "does not combine with strategy=zero1"),
        (["tp=2"], "tp=2"),
        (["nproc_per_node=2"], "dp + servers = 2 + 1 = 3 processes but nproc_per_node=2"),
        (["checkpoint.async_save=true"], "checkpoint.async_save=true: a parameter-server"),
    ],
)
def test_param_server_bad_input(overrides: list[str], expected: str) -> None:
    assert expected in plan_refusal(*PS, *overrides)


def test_diloco_bad_input() -> None:
    for extra, expected in (
        ("sync.every=0", "sync.every=0: must be >= 1"),
        ("parallel.strategy=fsdp", "sync.mode=diloco: replicas step alone"),
        (
            "parallel.nnodes=1:2",
            "parallel.nnodes=1:2: sync.mode=diloco checkpoints each replica's own optimizer state",
        ),
    ):
        assert expected in plan_refusal("sync.mode=diloco", extra)


def test_shards_are_whole_tensors_balanced_by_size() -> None:
    from dtrain_cli.sync_modes.param_server import assign_shards

    sizes = [100, 10, 60, 40, 1, 1]
    shards = assign_shards(sizes, 2)
    assert sorted(i for s in shards for i in s) == list(range(6))  # each tensor once
    loads = [sum(sizes[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= 10 and all(s == sorted(s) for s in shards)


def test_the_plan_counts_the_optimizer_state_where_the_mode_keeps_it() -> None:
    """DiLoCo's workers hold the inner AdamW state (2 words a parameter) and the outer
    step's anchor copy and Nesterov buffer (1 + 1); without outer momentum, the anchor
    only. A parameter server's workers hold none: the servers do."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.build import build_plan

    def optimizer_words(*over: str) -> float:
        cfg = compose_config("gpt_tiny", ["dp=2", *over])
        plan = build_plan(cfg)
        return plan.estimates.bytes_optimizer / (4 * model_spec(cfg).facts().num_params)

    assert optimizer_words() == 2
    assert optimizer_words("sync.mode=diloco") == 4
    assert optimizer_words("sync.mode=diloco", "sync.outer_momentum=0") == 3
    assert optimizer_words("sync.mode=local_sgd") == 2
    assert optimizer_words("sync.mode=param_server") == 0
    # dtrain plan says where DiLoCo's share comes from
    from dtrain_cli.plan.sync import sync_rows

    cfg = compose_config("gpt_tiny", ["dp=2", "sync.mode=diloco"])
    plan = build_plan(cfg)
    assert plan.sync.worker_state_bytes == 8 * model_spec(cfg).facts().num_params
    rows = dict(sync_rows(plan.sync))
    assert rows["worker: the mode's own state"].endswith("MiB (in the optimizer state per rank)")
    # the servers hold it instead: the optimizer's words for each one's share
    for over, words in ((["optim=adamw"], 2), (["optim=sgd"], 0), (["optim.momentum=0.9"], 1)):
        over = ["optim=sgd", *over] if words == 1 else over
        cfg = compose_config(
            "gpt_tiny", ["dp=2", "sync.mode=param_server", "sync.servers=2", *over]
        )
        servers = build_plan(cfg).sync.servers
        assert sum(s.params for s in servers) == model_spec(cfg).facts().num_params
        assert all(s.optimizer_bytes == 4 * words * s.params for s in servers), over
    from dtrain_cli.simulate.expect import coords_of, default_ranks

    plan = build_plan(cfg)  # dp=2 and two servers (ranks 2, 3): simulate shows one of each
    assert default_ranks(plan) == [0, 2]
    assert coords_of(plan, 3) == {"server": 1}
