"""Where overrides end and the script begins, a recipe that names a script, and the
torch-free helper a script reads the plan with. No processes started."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from dtrain_cli import script_env
from dtrain_cli.cli.common import compose_and_plan
from dtrain_cli.cli.run_cmd import LATE_OPTIONS, parse_late_options
from dtrain_cli.cli.script_args import split_script
from dtrain_cli.launch.rundir import materialize

VALUE_OPTIONS = [k for k, v in LATE_OPTIONS.items() if v]


@pytest.mark.parametrize(
    ("tokens", "bare", "dtrain", "script"),
    [
        (
            ["dp=4", "--", "train.py", "--lr=3", "dp=2"],
            False,
            ["dp=4"],
            ["train.py", "--lr=3", "dp=2"],
        ),
        (["train.py", "--epochs", "3"], False, [], ["train.py", "--epochs", "3"]),
        (
            ["dp=2", "-m", "pkg.train", "--lr", "1e-3"],
            False,
            ["dp=2"],
            ["-m", "pkg.train", "--lr", "1e-3"],
        ),
        (["dp=2", "--", "-m", "pkg.train"], False, ["dp=2"], ["-m", "pkg.train"]),
        (["dp=2", "script.path=x.py"], False, ["dp=2", "script.path=x.py"], None),
        (["dp=2"], False, ["dp=2"], None),
        (
            [
                "dp=2",
                "--",
            ],
            False,
            ["dp=2"],
            [],
        ),
        # dtrain run: no -- when it came first (click took it); bare names start the script
        (["myscript", "-x"], True, [], ["myscript", "-x"]),
        (["dp=4", "--nnodes", "2", "train", "a"], True, ["dp=4", "--nnodes", "2"], ["train", "a"]),
        (
            ["recipe=mine", "~train.seed", "+a=1"],
            True,
            ["recipe=mine", "~train.seed", "+a=1"],
            None,
        ),
    ],
)
def test_split_script(tokens, bare, dtrain, script):
    assert split_script(tokens, bare, VALUE_OPTIONS) == (dtrain, script)


def test_late_options_between_overrides():
    overrides, found, problems = parse_late_options(
        [
            "dp=4",
            "--nnodes",
            "2",
            "--node-rank=1",
            "--rdzv-endpoint",
            "h:29500",
            "--validate-cluster",
        ]
    )
    assert overrides == ["dp=4"] and problems == []
    assert found == {
        "--nnodes": ["2"],
        "--node-rank": ["1"],
        "--rdzv-endpoint": ["h:29500"],
        "--validate-cluster": [""],
    }
    _, _, problems = parse_late_options(["dp=2", "--epochs", "3"])
    assert problems and problems[0].startswith("--epochs: not an option of dtrain run")


def write_recipe(folder: Path) -> None:
    (folder / "recipes").mkdir()
    (folder / "recipes" / "my_script.yaml").write_text(
        "# dtrain run recipe=my_script --config-dir .\n"
        "defaults:\n  - base\n  - _self_\n"
        "script:\n  path: train.py\n  args: ['--epochs', '3']\n"
        "parallel: {dp: 4}\nlauncher: {max_restarts: 2}\n"
        "train: {global_batch_size: 24, steps: 10}\n"
        "optim: {base_lr: 0.01, base_batch_size: 12, lr_scaling: linear, warmup_steps: 2}\n"
        "checkpoint: {every_steps: 4}\n"
    )
    (folder / "train.py").write_text("print('hi')\n")


def test_recipe_names_the_script_and_the_command_line_replaces_it(tmp_path, monkeypatch):
    write_recipe(tmp_path)
    monkeypatch.chdir(tmp_path)
    _, plan = compose_and_plan(["recipe=my_script"], [tmp_path])
    assert plan.script.argv() == ["train.py", "--epochs", "3"]
    assert (plan.world_size, plan.max_restarts, plan.start_method) == (4, 2, "forkserver")
    (tmp_path / "other.py").write_text("print('other')\n")
    _, plan2 = compose_and_plan(["recipe=my_script", "dp=2"], [tmp_path], ["other.py", "--x"])
    assert plan2.script.argv() == ["other.py", "--x"] and plan2.world_size == 2
    with pytest.raises(typer.Exit) as exc:
        compose_and_plan(["recipe=my_script"], [tmp_path], ["-m", "no_such_module_here"])
    assert exc.value.exit_code == 2


def test_script_env_reads_the_plan(tmp_path, monkeypatch):
    write_recipe(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg, plan = compose_and_plan(["recipe=my_script", "run.root=runs"], [tmp_path])
    run_dir = materialize(cfg, plan)
    monkeypatch.delenv("DTRAIN_RUN_DIR", raising=False)
    assert script_env.current() is None  # not started by dtrain run: the script's defaults
    monkeypatch.setenv("DTRAIN_RUN_DIR", str(run_dir))
    monkeypatch.setenv("DTRAIN_PLAN", str(run_dir / "plan.yaml"))
    monkeypatch.setenv("RANK", "3")
    run = script_env.current()
    assert run is not None and run.rank == 3 and run.world_size == 4
    assert (run.global_batch_size, run.micro_batch_size, run.grad_accum) == (24, 6, 1)
    assert run.lr_at(0) == pytest.approx(0.02 / 2)  # linear scaling x2, warmup step 1 of 2
    assert run.lr_at(1) == pytest.approx(0.02)
    assert [s for s in range(1, 11) if run.should_checkpoint(s)] == [4, 8, 10]
    assert run.coords == {"pp": 0, "dp": 3, "tp": 0}
    assert run.config["script"]["path"] == "train.py" and run.preemption_signal == "USR1"
    assert script_env.EXIT_PREEMPTED == 75


def test_one_process_per_gpu_unless_dp_is_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setattr("dtrain_cli.plan.build.visible_gpu_count", lambda: 4)
    _, plan = compose_and_plan(["run.device=cpu"], [], ["train.py"])
    assert plan.world_size == 4  # one per visible GPU, as torchrun --nproc-per-node gpu
    _, plan = compose_and_plan(["run.device=cpu", "dp=2"], [], ["train.py"])
    assert plan.world_size == 2
    monkeypatch.setattr("dtrain_cli.plan.build.visible_gpu_count", lambda: 0)
    _, plan = compose_and_plan([], [], ["train.py"])
    assert plan.world_size == 1 and plan.device == "cpu"


def test_processes_per_node_without_dp_are_torchruns_nproc_per_node(tmp_path, monkeypatch, capsys):
    """``dtrain run nproc_per_node=2 -- train.py``, as ``torchrun --nproc-per-node 2``: the
    plan refused it ('set dp=2'), though own-script.md names it the number of ranks."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setattr("dtrain_cli.plan.build.visible_gpu_count", lambda: 0)
    _, plan = compose_and_plan(["nproc_per_node=2"], [], ["train.py"])
    assert (plan.world_size, plan.nnodes, plan.nproc_per_node) == (2, 1, 2)
    _, plan = compose_and_plan(["nproc_per_node=2", "nnodes=3"], [], ["train.py"])
    assert (plan.world_size, plan.nnodes, plan.nproc_per_node) == (6, 3, 2)
    with pytest.raises(typer.Exit):  # both given and at odds: still said, not guessed
        compose_and_plan(["nproc_per_node=2", "dp=3"], [], ["train.py"])
    capsys.readouterr()
    with pytest.raises(typer.Exit):  # another mistake is said alone, not with 'set dp=4'
        compose_and_plan(["nproc_per_node=2", "nnodes=2", "train.stepz=3"], [], ["train.py"])
    said = capsys.readouterr().err
    assert "unknown key 'train.stepz'" in said and "set dp" not in said, said


def test_plan_and_sbatch_take_a_script_file_without_py_after_dashes(tmp_path, monkeypatch):
    """Colleague's a: Click drops the ``--`` of ``dtrain plan -- exit3``; a file that
    exists is the script (as ``dtrain run -- exit3`` takes it), a word that is no file
    stays an override mistake."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "exit3").write_text("import sys\nsys.exit(3)\n")
    assert split_script(["dp=2", "exit3", "--x"]) == (["dp=2"], ["exit3", "--x"])
    assert split_script(["dp=2", "nofile"]) == (["dp=2", "nofile"], None)
    runner = CliRunner()
    planned = runner.invoke(app, ["plan", "--", "exit3"])
    assert planned.exit_code == 0, planned.output
    assert "python exit3" in planned.output and "no value" not in planned.output
    job = runner.invoke(app, ["sbatch", "--dry-run", "--", "exit3"])
    assert job.exit_code == 0, job.output
    assert "exit3" in job.output and "no value" not in job.output
    assert not (tmp_path / "runs").exists()
