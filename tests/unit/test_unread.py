"""Keys the command line sets that the layout never reads are named in the plan's warnings
(dtrain_cli/plan/unread.py); before, `pipeline.microbatches=4` at pp=1 or `sync.outer_lr=0.5`
without DiLoCo trained as if never typed and said nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.config.compose import compose_config
from dtrain_cli.plan.unread import unread_warnings

CASES = [
    (
        ["pipeline.schedule=gpipe"],
        ["pipeline.schedule=gpipe: read only with pp > 1 (parallel.pp=1); ignored"],
    ),
    (
        ["+pipeline.microbatches=4"],
        ["pipeline.microbatches=4: read only with pp > 1 (parallel.pp=1); ignored"],
    ),
    (["pp=2", "pipeline.microbatches=4"], []),
    (
        ["parallel.tp_plan={a: colwise}"],
        ["parallel.tp_plan={a: colwise}: read only with tp > 1 (parallel.tp=1); ignored"],
    ),
    (
        ["dp=2", "sync.outer_lr=0.5"],
        ["sync.outer_lr=0.5: read only by sync.mode=diloco (sync.mode=sync); ignored"],
    ),
    (
        ["dp=2", "sync.mode=diloco", "sync.every=4", "sync.servers=2"],
        ["sync.servers=2: read only by sync.mode=param_server (sync.mode=diloco); ignored"],
    ),
    (["dp=2", "sync.mode=local_sgd", "sync.every=4", "sync.warmup_steps=2"], []),
    (["dp=2", "sync.mode=param_server", "sync.max_staleness=1"], []),
    (["dp=2", "train.steps=3", "optim.base_lr=1e-3"], []),
    (
        ["dp=2", "comm.powersgd_rank=2"],
        [
            "comm.powersgd_rank=2: read only with comm.compression=powersgd (comm.compression="
            "none); ignored"
        ],
    ),
    (["dp=2", "comm.compression=powersgd", "comm.powersgd_start_iter=2"], []),
    # no gradient all-reduce at dp=1; no DDP bucket under fsdp (both were silent)
    (
        ["comm.compression=fp16"],
        [
            "comm.compression=fp16: read only with dp > 1 (parallel.dp=1: no gradient is "
            "all-reduced); ignored"
        ],
    ),
    (
        ["dp=2", "parallel.strategy=fsdp", "comm.bucket_mb=0.01"],
        [
            "comm.bucket_mb=0.01: read only by DDP's buckets (strategy ddp or zero1; "
            "parallel.strategy=fsdp); ignored"
        ],
    ),
    (["dp=2", "parallel.strategy=zero1", "comm.bucket_mb=10"], []),
    # nothing to compare: one replica, or shards (a new user's find: no word before)
    (
        ["debug.replica_check_every=1"],
        [
            "debug.replica_check_every=1: read only where ranks hold replicas (dp > 1 under "
            "ddp or zero1, hsdp's shard groups, or tp > 1; dp=1); ignored"
        ],
    ),
    (
        ["dp=2", "parallel.strategy=fsdp", "debug.replica_check_every=1"],
        [
            "debug.replica_check_every=1: read only where ranks hold replicas (dp > 1 under "
            "ddp or zero1, hsdp's shard groups, or tp > 1; parallel.strategy=fsdp shards them); "
            "ignored"
        ],
    ),
    # hsdp: one shard group holds no replicas; two do (each rank's shard, across the groups)
    (
        ["dp=2", "parallel.strategy=hsdp", "parallel.dp_shard=2", "debug.replica_check_every=1"],
        [
            "debug.replica_check_every=1: read only where ranks hold replicas (dp > 1 under "
            "ddp or zero1, hsdp's shard groups, or tp > 1; parallel.strategy=hsdp shards them); "
            "ignored"
        ],
    ),
    (["dp=4", "parallel.strategy=hsdp", "parallel.dp_shard=2", "debug.replica_check_every=1"], []),
    (["dp=2", "debug.replica_check_every=1"], []),
    (["tp=2", "debug.replica_check_every=1"], []),
    # the other optimizer's keys, fp16's loss scaling at fp32 (a new user's find: silent)
    (
        ["optim.momentum=0.9"],
        ["optim.momentum=0.9: read only by optim=sgd (optim.name=adamw); ignored"],
    ),
    (["optim=sgd", "optim.momentum=0.9"], []),
    (
        ["precision.init_scale=1024"],
        [
            "precision.init_scale=1024: read only with precision=fp16, its loss scaling "
            "(precision=fp32); ignored"
        ],
    ),
    # a key given twice: the last wins, said when the values differ (a shorthand and its key)
    (
        ["dp=2", "steps=4", "parallel.dp=1", "train.steps=4"],
        ["parallel.dp given 2 times (dp=2, parallel.dp=1): the last, parallel.dp=1, is used"],
    ),
    (["steps=4", "steps=4"], []),
    # model=hf wraps its _no_split_modules: a misspelt class trained as if never typed
    (
        ["dp=2", "parallel.strategy=fsdp", "parallel.fsdp_units=[Block]"],
        [
            "parallel.fsdp_units=[Block]: read only by model=custom; the other kinds wrap their "
            "own blocks (model=hf: the classes its _no_split_modules names); ignored"
        ],
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), CASES, ids=[" ".join(o) for o, _ in CASES])
def test_a_key_the_layout_never_reads_is_named(overrides, expected):
    cfg = compose_config("gpt_tiny", overrides, [], validate=False)
    assert unread_warnings(cfg, overrides) == expected


def test_every_sync_key_is_read_by_some_mode():
    """Each sync.* key belongs to a mode's ``reads`` (a key no mode reads would never warn)."""
    from dataclasses import fields

    from dtrain_cli.config.schema import SyncConfig
    from dtrain_cli.sync_modes import mode_for, names

    read = {key for name in names() for key in mode_for(name).reads}
    assert {f.name for f in fields(SyncConfig)} - {"mode"} == read


def test_the_warning_is_printed_by_plan_and_a_recipe_value_is_not_named(tmp_path):
    result = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "sync.every=4"])
    assert result.exit_code == 0, result.output
    assert "warning: sync.every=4: read only by sync.mode=" in result.output
    conf = tmp_path / "conf" / "recipes"
    conf.mkdir(parents=True)
    (conf / "piped.yaml").write_text(
        "# dtrain launch recipe=piped pp=2\n# A recipe ready for pp=2.\n"
        "defaults:\n  - base\n  - _self_\npipeline:\n  schedule: gpipe\n"
    )
    result = CliRunner().invoke(app, ["plan", "recipe=piped", "-c", str(tmp_path / "conf")])
    assert result.exit_code == 0, result.output
    assert "ignored" not in result.output


def test_debug_keys_of_dtrains_trainer_are_named_for_a_script(tmp_path, monkeypatch):
    """``dtrain run debug.collective_timeout_s=10 -- train.py`` hung past its 10 s without a
    word: the watchdog is dtrain's trainer's; the line says what limits a script instead."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    over = ["dp=2", "debug.collective_timeout_s=10", "debug.hang_watchdog=false"]
    result = CliRunner().invoke(app, ["plan", *over, "--", "train.py"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    said = [" ".join(w.split()) for w in result.output.split("warning: ")[1:]]
    assert (
        "debug.collective_timeout_s=10: read only by dtrain's own trainer; your script's limit "
        "is its process group's: init_process_group(timeout=timedelta(seconds=N)); ignored"
    ) in said, said
    assert any(w.startswith("debug.hang_watchdog=false: read only by dtrain's") for w in said)
    trainer = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "debug.collective_timeout_s=10"])
    assert trainer.exit_code == 0 and "ignored" not in trainer.output, trainer.output


def test_a_custom_models_fsdp_units_are_read():
    over = ["dp=2", "parallel.strategy=fsdp", "parallel.fsdp_units=[Linear]"]
    conf = Path(__file__).resolve().parents[2] / "examples" / "conf"
    cfg = compose_config("my_experiment", over, [conf], validate=False)
    assert cfg.model.kind == "custom" and unread_warnings(cfg, over) == []
