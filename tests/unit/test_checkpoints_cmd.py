"""`dtrain checkpoints PATH` takes what `dtrain resume --ckpt` takes: a run dir, its
checkpoints/ folder or one checkpoints/step_* folder; anything else is bad input (exit 2).
A step folder ended in a FileNotFoundError traceback, and /tmp in exit 1 'no checkpoints'."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "runs" / "r"
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    (run / "plan.yaml").write_text("world_size: 1\n")
    return run


@pytest.mark.parametrize("given", ["", "checkpoints", "checkpoints/step_000003"])
def test_a_run_its_checkpoints_or_one_step_list_the_same_run(run_dir, given):
    result = CliRunner().invoke(app, ["checkpoints", str(run_dir / given)], env={"COLUMNS": "300"})
    assert f"checkpoints of {run_dir}" in result.output, result.output
    assert "step_000003" in result.output or "│ 3 " in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_folder_that_is_no_run_is_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["checkpoints", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path}: not a run dir (no plan.yaml); give a folder `dtrain launch` made"
    )


def _complete(step_dir):
    from dtrain_cli.checkpoint import catalog

    step_dir.mkdir(parents=True)
    (step_dir / ".metadata").write_bytes(b"dcp")
    catalog.write_manifest(step_dir)


@pytest.mark.parametrize("given", ["", "checkpoints", "checkpoints/step_000006"])
def test_resume_and_export_take_a_run_its_checkpoints_or_one_step(tmp_path, given):
    """--ckpt runs/<run>/checkpoints was 'neither a run directory nor a checkpoints/step_*
    folder'; it is the run's newest complete checkpoint, as the run dir is."""
    from dtrain_cli.checkpoint import catalog

    run = tmp_path / "runs" / "r"
    _complete(run / "checkpoints" / "step_000003")
    _complete(run / "checkpoints" / "step_000006")
    (run / "checkpoints" / "step_000009").mkdir()  # a save that never finished
    (run / "plan.yaml").write_text("world_size: 1\n")
    assert catalog.resolve(run / given) == (run, run / "checkpoints" / "step_000006")
    with pytest.raises(catalog.CheckpointError, match="neither a run directory"):
        catalog.resolve(tmp_path / "runs")
    # a save in progress (or abandoned) holds a plan.yaml: it was taken for a run dir
    half = run / "checkpoints" / ".tmp-step_000012-dtrain-x-0"
    half.mkdir()
    (half / "plan.yaml").write_text("world_size: 1\n")
    with pytest.raises(catalog.CheckpointError) as info:
        catalog.resolve(half)
    assert str(info.value).startswith(f"{half}: a checkpoint being written, or left by a save")


@pytest.mark.parametrize("command", ["resume", "export"])
def test_resume_and_export_take_the_run_without_ckpt(tmp_path, command):
    """`dtrain resume runs/<run>` (as `dtrain checkpoints runs/<run>` is written) was
    Typer's "Missing option '--ckpt'": the path written first is the checkpoint."""
    missing = tmp_path / "runs" / "nothere"
    extra = ["--out", str(tmp_path / "m.safetensors")] if command == "export" else ["steps=9"]
    for args in ([str(missing), *extra], [*extra, str(missing)]):  # after them: the same
        result = CliRunner().invoke(app, [command, *args])
        assert result.exit_code == 2
        assert result.stderr.strip() == f"error: {missing}: no such file or folder"


def test_resume_without_a_checkpoint_names_both_forms():
    result = CliRunner().invoke(app, ["resume", "steps=9"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(
        "error: no checkpoint named: dtrain resume runs/<run> (or --ckpt PATH"
    )


def test_export_given_the_checkpoint_twice_is_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["export", "a", "--ckpt", "b", "--out", "m.safetensors"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: a and --ckpt b: name the checkpoint once"


@pytest.mark.parametrize("out", ["model.pt", "model"])
def test_export_names_a_file_safetensors_can_be(tmp_path, out):
    """`--out model.pt` wrote safetensors bytes under a name torch.load would be given."""
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", out])
    assert result.exit_code == 2
    stem = out.rsplit(".", 1)[0] if "." in out else out
    assert result.stderr.strip() == (
        f"error: --out {out}: the safetensors format writes one .safetensors file; "
        f"name it {stem}.safetensors, give a folder (DIR/), or use --format hf"
    )


def test_export_into_a_new_folder_needs_its_parent(tmp_path):
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", "nope/deeper/"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --out nope/deeper/: folder nope does not exist"


def test_one_checkpoint_asked_about_is_the_one_listed_and_verify_says_it_ran(tmp_path):
    """A good step_* folder was listed with the whole run and exited 1 for another, bad
    one; --verify printed the same table as without it, saying nothing of the sha256."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    run = tmp_path / "runs" / "r"
    _complete(run / "checkpoints" / "step_000003")
    _complete(run / "checkpoints" / "step_000006")
    (run / "checkpoints" / "step_000006" / ".metadata").write_bytes(b"changed")  # bad sha256
    (run / "plan.yaml").write_text("world_size: 1\n")
    good = run / "checkpoints" / "step_000003"
    result = CliRunner().invoke(app, ["checkpoints", str(good), "--verify"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "│ 3 " in result.stdout and "│ 6 " not in result.stdout
    assert "verified: every file of the 1 checkpoint matches the sha256 in its manifest" in (
        result.stdout
    )
    whole = CliRunner().invoke(app, ["checkpoints", str(run), "--verify"], terminal_width=200)
    assert whole.exit_code == 1 and "verified:" not in whole.stdout


def test_a_run_means_its_newest_complete_checkpoint_whatever_latest_says(tmp_path):
    """A save's crash between its rename and its write of `latest` leaves `latest` naming an
    older checkpoint: `dtrain resume RUN` resumed from it and set the newer ones aside (a
    user's find). The run means its newest complete one, and `dtrain checkpoints` marks it."""
    from dtrain_cli.checkpoint import catalog

    run = tmp_path / "runs" / "r"
    for step in (10, 20, 30):
        _complete(run / "checkpoints" / f"step_{step:06d}")
    (run / "checkpoints" / "latest").write_text("step_000010\n")
    (run / "plan.yaml").write_text("world_size: 1\n")
    assert catalog.resolve(run) == (run, run / "checkpoints" / "step_000030")
    table = CliRunner().invoke(app, ["checkpoints", str(run)], env={"COLUMNS": "300"}).output
    marked = [line for line in table.splitlines() if "latest" in line]
    assert len(marked) == 1 and "│ 30 " in marked[0], table


def test_a_resume_that_changes_the_lr_schedule_says_so(tmp_path):
    """`dtrain resume RUN train.steps=30` after 20 steps: the cosine decay then spans 30 and
    step 21 ran at 5.5e-4 after 1.2e-4 at step 20, without a word (a user's find)."""
    from dtrain_cli.cli.common import compose_and_plan
    from dtrain_cli.cli.resume_cmd import lr_change

    _, old = compose_and_plan(["recipe=gpt_tiny", "train.steps=20"], [])
    old.save(tmp_path / "plan.yaml")
    _, longer = compose_and_plan(["recipe=gpt_tiny", "train.steps=30"], [])
    said = lr_change(tmp_path, longer, 20)
    assert said is not None and said.startswith(
        "the LR schedule changes with this resume (steps 20 -> 30): step 21 runs at lr "
        f"{longer.lr.lr_at(20):.3g}, where the checkpoint's schedule had {old.lr.lr_at(20):.3g}"
    ), said
    _, same = compose_and_plan(["recipe=gpt_tiny", "train.steps=20"], [])
    assert lr_change(tmp_path, same, 10) is None


def test_a_resume_that_changes_the_global_batch_or_the_val_samples_says_so(tmp_path):
    """train.global_batch_size=32 after 16 and train.eval_batches=50 after 2 were accepted
    without a word, the val curve changing its definition mid-run (a new user's find)."""
    from dtrain_cli.cli.common import compose_and_plan
    from dtrain_cli.cli.resume_cmd import definition_changes
    from dtrain_cli.config.compose import config_to_yaml

    cfg, old = compose_and_plan(["recipe=gpt_tiny", "train.global_batch_size=16"], [])
    old.save(tmp_path / "plan.yaml")
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg))
    assert definition_changes(tmp_path, cfg, old, 8) == []
    over = ["recipe=gpt_tiny", "train.global_batch_size=32", "train.eval_batches=50"]
    new_cfg, new = compose_and_plan(over, [])
    assert definition_changes(tmp_path, new_cfg, new, 8) == [
        "the global batch changes with this resume (16 -> 32 samples): steps after 8 take "
        "32 samples each, where the run's first 8 took 16",
        f"train.eval_batches {cfg.train.eval_batches} -> 50: the val loss after step 8 is "
        "over other samples than before it",
    ]


def test_a_resume_at_another_precision_or_a_layout_that_rounds_its_own_way_says_so(tmp_path):
    """precision=fp32 over a bf16 run, and dp=2 -> 1 with dropout, were accepted without a
    word, the curve then 8e-4 off the run's (a new user's find); an fp32 layout change
    without dropout continues exactly and says nothing."""
    from dtrain_cli.cli.common import compose_and_plan
    from dtrain_cli.cli.resume_cmd import definition_changes
    from dtrain_cli.config.compose import config_to_yaml

    base = ["recipe=gpt_tiny", "dp=2", "model.dropout=0.1"]
    cfg, old = compose_and_plan(base, [])
    old.save(tmp_path / "plan.yaml")
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg))
    new_cfg, new = compose_and_plan([*base, "dp=1", "precision=bf16"], [])
    said = definition_changes(tmp_path, new_cfg, new, 8)
    assert said[0] == (
        "precision fp32 -> bf16: the steps after 8 compute at another precision (the curve "
        "goes on, not as the run's would have)"
    )
    assert said[1].startswith(
        "the layout changes with this resume (pp=1 x dp=2 x tp=1 ddp -> pp=1 x dp=1 x tp=1 "
        "ddp) and dropout 0.1 draws its masks by rank, bf16 sums (tp's all-reduces, dp's) "
        "round by layout: the steps after 8 follow"
    )
    plain = ["recipe=gpt_tiny", "dp=2"]
    cfg, old = compose_and_plan(plain, [])
    old.save(tmp_path / "plan.yaml")
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg))
    assert definition_changes(tmp_path, *compose_and_plan([*plain, "dp=1"], []), 8) == []


def test_a_set_aside_or_copied_checkpoint_says_where_it_goes(tmp_path):
    """A checkpoint in checkpoints/superseded/ or copied elsewhere holds a plan.yaml: it was
    taken for a run dir and refused as 'no complete checkpoint in <it>/checkpoints'."""
    from dtrain_cli.checkpoint import catalog

    run = tmp_path / "runs" / "r"
    aside = run / "checkpoints" / "superseded" / "step_000020-1764900000"
    _complete(aside)
    (aside / "meta.json").write_text('{"step": 20}')
    (aside / "plan.yaml").write_text("world_size: 1\n")
    with pytest.raises(catalog.CheckpointError) as err:
        catalog.resolve(aside)
    assert str(err.value) == (
        f"{aside}: a checkpoint an earlier resume set aside; to resume or export it, move it "
        f"back as {run / 'checkpoints' / 'step_000020'} (the run's newer ones go aside in turn)"
    )
    copy = tmp_path / "loose" / "step_000020"
    _complete(copy)
    (copy / "meta.json").write_text('{"step": 20}')
    with pytest.raises(catalog.CheckpointError, match="outside a run's checkpoints/ folder"):
        catalog.resolve(copy)
