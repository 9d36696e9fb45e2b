"""HSDP (``parallel.strategy=hsdp``): FSDP2 sharding inside a shard group, replicas across
the groups, on a 2-D (dp_replicate, dp_shard) mesh — one registry entry,
``dtrain_cli/strategies/hsdp.py``. Its training equals one process (test_strategies.py,
``hsdp2x2``); here: the plan and the advisor, the mistakes, and resume at another dp."""

from __future__ import annotations

import pytest

from dtrain_cli.config.compose import compose_config
from dtrain_cli.errors import ConfigError
from dtrain_cli.plan.advise import candidates
from dtrain_cli.plan.build import Resources, build_plan
from dtrain_cli.strategies import names, strategy_for

CPU = Resources(num_gpus=0, num_cpus=2)


def plan(*overrides: str):
    return build_plan(compose_config("gpt_small", list(overrides)), CPU)


def test_hsdp_is_registered_and_chosen_like_any_strategy():
    assert "hsdp" in names() and strategy_for("hsdp").shards_params
    lays = candidates(compose_config("gpt_small", ["train.global_batch_size=32"]), world=8)
    assert {lay.strategy for lay in lays if lay.dp > 1} == set(names())


def test_plan_holds_a_shard_groups_share_of_the_model():
    """dp=4 in 2 groups of 2: each rank holds half the model, as fsdp at dp=2 does."""
    hsdp = plan("dp=4", "parallel.strategy=hsdp", "parallel.dp_shard=2")
    fsdp = plan("dp=2", "parallel.strategy=fsdp")
    assert (hsdp.dims.dp_replicate, hsdp.dims.dp_shard) == (2, 2)
    for part in ("bytes_params", "bytes_grads", "bytes_optimizer"):
        assert getattr(hsdp.estimates, part) == getattr(fsdp.estimates, part), part
    # the gathers stay in the group, each gradient shard is all-reduced across groups
    full = plan("dp=4", "parallel.strategy=fsdp").estimates.comm_bytes_per_step
    assert hsdp.estimates.comm_bytes_per_step != full > 0


def test_default_shard_group_is_a_node():
    """Without parallel.dp_shard a group is one node's dp ranks: 4 nodes x 2 -> 4 groups."""
    p = plan("dp=8", "parallel.nnodes=4", "parallel.strategy=hsdp")
    assert (p.nproc_per_node, p.dims.dp_replicate, p.dims.dp_shard) == (2, 4, 2)
    one_node = plan("dp=2", "parallel.strategy=hsdp")
    assert one_node.dims.dp_replicate == 1
    assert any("one shard group" in w for w in one_node.warnings)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["dp=4", "parallel.strategy=hsdp", "parallel.dp_shard=3"], "must divide dp=4"),
        (["dp=4", "parallel.strategy=fsdp", "parallel.dp_shard=2"], "only parallel.strategy=hsdp"),
        (["dp=2", "parallel.strategy=hsdp", "parallel.nnodes=1:2"], "hsdp's shard groups"),
        (["dp=2", "parallel.strategy=hsdp2"], "choose one of ddp, zero1, fsdp, hsdp"),
    ],
)
def test_mistakes_are_one_line(overrides, says):
    with pytest.raises(ConfigError) as err:
        plan(*overrides)
    assert any(says in p for p in err.value.problems), err.value.problems


def test_dtrain_plan_and_advise_show_hsdp(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(tmp_path)
    shown = CliRunner().invoke(
        app, ["plan", "recipe=gpt_small", "dp=4", "parallel.strategy=hsdp", "parallel.dp_shard=2"]
    )
    assert shown.exit_code == 0, shown.output
    assert "hsdp" in shown.output and "sharded over dp=2" in shown.output
    advised = CliRunner().invoke(
        app, ["advise", "recipe=gpt_1b", "hardware=h100_80g", "parallel.nnodes=2", "--json"]
    )
    assert advised.exit_code == 0, advised.output
    assert '"strategy": "hsdp"' in advised.output
