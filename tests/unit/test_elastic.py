"""Elastic membership, the fast part: ``parallel.nnodes=MIN:MAX`` in the config, the plan's
layout for every node count, the worker's pick by WORLD_SIZE, the membership record, bad
input. The live runs (a node lost, one joining) are in tests/launch/test_elastic_live.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.config.compose import compose_config
from dtrain_cli.errors import ConfigError
from dtrain_cli.launch.multinode import nnodes_override, parse_nnodes
from dtrain_cli.plan.build import Resources, build_plan
from dtrain_cli.plan.plan import Plan
from dtrain_cli.runtime.components.membership import Membership

CPU = Resources(num_gpus=0, num_cpus=2)
runner = CliRunner()


def plan_for(*overrides: str) -> Plan:
    return build_plan(compose_config("gpt_tiny", list(overrides)), CPU)


def test_every_size_keeps_the_global_batch_and_the_lr_schedule():
    # 4 nodes x 1 process, dp=4; global 12 in micro-batches of 3: 3 nodes cannot keep it
    full = plan_for("nnodes=1:4", "dp=4", "train.global_batch_size=12", "train.micro_batch_size=3")
    el = full.elastic
    assert el is not None and (el.min_nnodes, el.max_nnodes) == (1, 4)
    layouts = {
        s.nnodes: (s.world_size, s.batch.dp, s.batch.grad_accum, s.mesh_shape) for s in el.sizes
    }
    assert layouts == {1: (1, 1, 4, [1, 1, 1]), 2: (2, 2, 2, [1, 2, 1]), 4: (4, 4, 1, [1, 4, 1])}
    assert [r["nnodes"] for r in el.refused] == [3]
    assert "not divisible by micro_batch_size*dp = 3*3 = 9" in el.refused[0]["reason"]
    # the rendezvous would still admit 3 nodes: the plan says what a group of 3 does
    assert any("1:4: 3 node(s) cannot train this layout" in w for w in full.warnings)
    for n, size in ((s.nnodes, s) for s in el.sizes):
        sub = full.for_world_size(size.world_size)
        assert sub.nnodes == n and sub.batch.global_batch_size == 12
        assert sub.batch.micro_batch_size * sub.batch.grad_accum * sub.batch.dp == 12
        assert sub.lr == full.lr  # the schedule does not know the size
    assert full.for_world_size(4) is full
    assert any("launcher.max_restarts=0: a lost node ends the run" in w for w in full.warnings)
    kept = plan_for(
        "nnodes=1:4", "dp=4", "train.global_batch_size=12", "launcher.max_restarts=3",
        "checkpoint.every_steps=10",  # else: a restart would start over (said)
    )  # fmt: skip
    assert not any("max_restarts" in w for w in kept.warnings)
    with pytest.raises(ValueError, match=r"started 3 workers; this plan trains on 1, 2, 4 \("):
        full.for_world_size(3)


def test_the_plan_round_trips_through_yaml_with_its_sizes(tmp_path):
    full = plan_for("nnodes=1:2", "dp=4", "train.global_batch_size=16")
    full.save(tmp_path / "plan.yaml")
    back = Plan.load(tmp_path / "plan.yaml")
    assert back == full
    one = back.for_world_size(2)  # 2 processes per node
    assert (one.batch.dp, one.batch.grad_accum, one.mesh.shape) == (2, 2, [1, 2, 1])


def test_tp_stays_and_a_size_it_does_not_divide_is_refused():
    # 4 nodes x 1 process, dp=2 x tp=2: 3 processes cannot hold tp=2; 2 can (dp=1)
    full = plan_for("nnodes=2:4", "dp=2", "tp=2", "train.global_batch_size=8")
    assert [(s.nnodes, s.mesh_shape) for s in full.elastic.sizes] == [
        (2, [1, 1, 2]),
        (4, [1, 2, 2]),
    ]
    assert full.elastic.refused == [
        {"nnodes": 3, "reason": "3 processes (3 x 1) are not a multiple of tp*pp = 2"}
    ]
    with pytest.raises(
        ConfigError, match=r"at 1 node\(s\) 1 processes \(1 x 1\) are not a multiple"
    ):
        plan_for("nnodes=1:2", "dp=1", "tp=2", "train.global_batch_size=8")


def test_min_that_cannot_keep_the_global_batch_is_an_error():
    with pytest.raises(ConfigError) as exc:
        plan_for("nnodes=3:4", "dp=4", "train.global_batch_size=12", "train.micro_batch_size=3")
    (line,) = exc.value.problems
    assert line.startswith("parallel.nnodes=3:4: at 3 node(s) the global batch cannot be kept")
    assert line.endswith("use MIN >= 4 (admissible: 4)")


BAD_RANGES = [
    (["nnodes=3:2", "dp=2"], "parallel.nnodes=3:2: MIN is above MAX"),
    (["nnodes=0:2", "dp=2"], "parallel.nnodes=0:2: MIN must be >= 1"),
    (["parallel.nnodes=1:x"], "expected MIN:MAX node counts"),
    # the range as written, not only its MAX (it said parallel.nnodes=2)
    (["nnodes=1:2"], "parallel.nnodes=1:2: dp*tp*pp = 1 processes do not split evenly"),
    (
        ["nnodes=3:4", "dp=4", "train.global_batch_size=12", "train.micro_batch_size=3"],
        "at 3 node(s) the global batch cannot be kept",
    ),
]


def assert_bad_range(command: str, args: list[str], message: str, tmp_path) -> None:
    result = runner.invoke(app, [command, "recipe=gpt_tiny", *args])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("args", "message"), BAD_RANGES)
@pytest.mark.parametrize("command", ["plan"])  # launch: tests/launch/test_elastic.py
def test_bad_ranges_exit_2_one_line(command, args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_bad_range(command, args, message, tmp_path)


def test_plan_command_lists_the_sizes_and_the_refused_one():
    args = ["plan", "recipe=gpt_tiny", "nnodes=1:4", "dp=4", "train.global_batch_size=12"]
    args.append("train.micro_batch_size=3")
    result = runner.invoke(app, [*args, "--format", "yaml"])
    assert result.exit_code == 0, result.output
    assert "elastic:" in result.output and "refused:" in result.output
    shown = runner.invoke(app, args)
    assert "elastic membership: 1-4 nodes" in shown.output and "refused" in shown.output


def test_launch_flag_ranges():
    assert parse_nnodes("1:4") == ((1, 4), []) and nnodes_override((1, 4)) == [
        "parallel.nnodes=1:4"
    ]
    assert nnodes_override((2, 2)) == ["parallel.nnodes=2"]
    assert "must be positive" in parse_nnodes("0:2")[1][0]


def test_membership_records_a_change_with_the_steps_redone(tmp_path):
    full = plan_for("nnodes=1:2", "dp=2", "train.global_batch_size=8")
    two = Membership(tmp_path, full, rank=0, resumed_step=0)
    for step in range(1, 13):
        two.step_done(step)
    assert two.changes() == []
    one = Membership(tmp_path, full.for_world_size(1), rank=0, resumed_step=10)
    one.step_done(11)
    (change,) = one.changes()
    assert (change["old_world_size"], change["new_world_size"]) == (2, 1)
    assert (change["old_nnodes"], change["new_nnodes"]) == (2, 1)
    assert (change["old_last_step"], change["resumed_step"], change["steps_redone"]) == (12, 10, 2)
    assert change["took_s"] >= 0
    progress = json.loads((tmp_path / "elastic" / "progress.json").read_text())
    assert progress["world_size"] == 1 and progress["step"] == 11
    assert Membership(tmp_path, full, rank=1, resumed_step=0).changes() == []  # rank 0 only


def test_the_summary_counts_the_whole_run_and_the_sizes_it_ran_at(tmp_path, monkeypatch):
    """Issue 24 #18: after a shrink, train_wall_s is the whole run's (since the first group
    started), the last group's apart, with the sizes the run trained at; a dtrain resume
    starts the count again."""
    from dtrain_cli.runtime.components import membership

    clock = [1000.0]
    monkeypatch.setattr(membership.time, "time", lambda: clock[0])
    full = plan_for("nnodes=1:2", "dp=2", "train.global_batch_size=8")
    two = Membership(tmp_path, full, rank=0, resumed_step=0)
    for step in range(1, 13):
        clock[0] += 1
        two.step_done(step)
    clock[0] = 1020.0
    one = Membership(tmp_path, full.for_world_size(1), rank=0, resumed_step=10)
    for step in range(11, 21):
        clock[0] += 1
        one.step_done(step)
    assert one.summary(wall_s=10.0) == {
        "train_wall_s": 30.0,
        "train_wall_s_last_membership": 10.0,
        "memberships": [
            {"world_size": 2, "nnodes": 2, "first_step": 1, "last_step": 12},
            {"world_size": 1, "nnodes": 1, "first_step": 11, "last_step": 20},
        ],
    }
    from dtrain_cli.rundir.layout import RunDir

    RunDir(tmp_path).resumes.write_text(json.dumps({"time": 1040.0}) + "\n")
    clock[0] = 1050.0
    again = Membership(tmp_path, full.for_world_size(1), rank=0, resumed_step=20)
    clock[0] = 1055.0
    again.step_done(21)
    assert again.summary(wall_s=5.0)["train_wall_s"] == 5.0
    assert again.summary(wall_s=5.0)["memberships"] == [
        {"world_size": 1, "nnodes": 1, "first_step": 21, "last_step": 21}
    ]
    assert Membership(tmp_path, full, rank=1, resumed_step=0).summary(1.0) == {}
