"""Your own model through the seam: examples/my_models/net.py (a residual MLP regressor whose
attribute names share nothing with the GPT, its own dataset, MSE) under every layout, against
the single-process loss curve; resume; the README's example; the plan counts the module it
builds. The bad inputs, refused before any worker starts: tests/unit/test_own_model.py."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, Run, run_dtrain
from tests.unit.test_own_model import ENV, EXAMPLES, OWN

TP_PLAN = "parallel.tp_plan={trunk.*.up:colwise,trunk.*.down:rowwise}"
PIPELINE = ["pipeline.layers=trunk", "pipeline.first=[stem]", "pipeline.last=[readout]"]
LAYOUTS = {
    "dp2": ["dp=2"],
    "zero1": ["dp=2", "parallel=zero1"],
    "fsdp": ["dp=2", "parallel=fsdp"],
    # its blocks found as FSDP finds them (no pipeline.layers): the plan refused this before
    "fsdp_ac": ["dp=2", "parallel=fsdp", "parallel.activation_checkpointing=full"],
    "tp2": ["tp=2", TP_PLAN],
    "pp2": ["pp=2", "train.micro_batch_size=2", *PIPELINE],
}


def launch_own(tmp_path_factory: pytest.TempPathFactory, name: str, *extra: str) -> Run:
    cwd = tmp_path_factory.mktemp(name)
    run = run_dtrain(["launch", *OWN, *extra], cwd, env=ENV)
    assert run.returncode == 0, f"{name} failed:\n{run.stdout}\n{run.stderr}"
    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return launch_own(tmp_path_factory, "own-dp1", "dp=1", "checkpoint.every_steps=2")


def losses(run: Run) -> list[float]:
    return [r["loss"] for r in run.metrics()]


@pytest.mark.multiproc
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_own_model_reproduces_the_single_process_curve(reference, tmp_path_factory, layout):
    run = launch_own(tmp_path_factory, f"own-{layout}", *LAYOUTS[layout])
    ref = losses(reference)
    assert len(ref) == 4
    assert losses(run) == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert run.summary()["param_sum"] == pytest.approx(reference.summary()["param_sum"], rel=1e-5)


@pytest.mark.multiproc
def test_own_model_resume_is_bitwise(tmp_path_factory):
    from dtrain_cli.checkpoint import catalog

    run = launch_own(tmp_path_factory, "own-resume", "dp=2", "checkpoint.every_steps=2")
    first, first_digest = losses(run), run.summary()["param_digest"]
    step2 = catalog.checkpoints_dir(run.run_dir) / "step_000002"
    resumed = run_dtrain(["resume", "--ckpt", str(step2)], run.run_dir.parent.parent, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert run.summary()["resumed_from"] == "step_000002"
    assert losses(run) == first  # steps 3-4 again, bit for bit
    assert run.summary()["param_digest"] == first_digest


def test_plan_of_an_own_model_counts_the_module_it_builds(tmp_path, monkeypatch):
    """The plan of a custom model comes from a meta-device build of the user's class."""
    import yaml

    monkeypatch.syspath_prepend(str(EXAMPLES))
    from my_models.net import Net

    expected = sum(p.numel() for p in Net(in_dim=16, width=64, depth=4, out_dim=4).parameters())
    run = run_dtrain(["plan", *OWN, "dp=2", "--format", "yaml"], tmp_path, env=ENV)
    assert run.returncode == 0, run.stderr
    plan = yaml.safe_load(run.stdout)
    assert plan["estimates"]["num_params"] == expected
    assert plan["batch"]["unit"] == "samples" and plan["loss"] == "mse"


@pytest.mark.multiproc
def test_the_readme_example_runs_as_written(tmp_path):
    """README, "Your own model": `cd examples && dtrain launch recipe=my_experiment
    --config-dir conf dp=2`, in a copy of the folder (runs/ lands next to the code)."""
    import shutil

    work = tmp_path / "examples"
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    readme = (REPO / "README.md").read_text()
    assert "dtrain launch recipe=my_experiment --config-dir conf dp=2" in readme
    run = run_dtrain(["launch", "recipe=my_experiment", "--config-dir", "conf", "dp=2"], work)
    assert run.returncode == 0, run.stderr
    assert run.run_dir is not None and run.run_dir.parent == work / "runs"
    curve = losses(run)
    assert len(curve) == 5 and curve[-1] < 0.5 * curve[0]  # it learns the linear map
    assert run.summary()["val_loss"] < curve[0]


def test_arguments_of_a_model_or_dataset_take_either_form(tmp_path):
    """Issue 24 #10: model.NAME=V and model.kwargs.NAME=V are the same argument, as
    data.NAME=V and data.kwargs.NAME=V are."""
    import yaml

    def plan(*extra: str) -> dict:
        run = run_dtrain(
            ["plan", *OWN, *extra, "--format", "yaml", "--show-config"], tmp_path, env=ENV
        )
        assert run.returncode == 0, run.stderr
        return yaml.safe_load(run.stdout)

    flat, nested = (
        plan("model.width=16", "data.n=64"),
        plan("model.kwargs.width=16", "data.kwargs.n=64"),
    )
    assert flat["plan"]["estimates"] == nested["plan"]["estimates"]
    assert flat["config"]["model"] == nested["config"]["model"]
    assert nested["config"]["model"]["width"] == 16 and "kwargs" not in nested["config"]["model"]
    assert flat["config"]["data"]["kwargs"]["n"] == nested["config"]["data"]["kwargs"]["n"] == 64


BOOM = """import torch


class Boom(torch.nn.Module):
    def __init__(self, vocab_size=256, block_size=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, vocab_size)

    def forward(self, x):
        raise RuntimeError("boom in forward")
"""


def test_a_model_failing_in_step_1_shows_its_traceback_before_its_run_dir_goes(tmp_path):
    """The report pointed to logs/rank_0.log, in the run dir it then removed (nothing had
    trained): the traceback was lost (a new user's find). It is printed instead."""
    (tmp_path / "boom_model.py").write_text(BOOM)
    args = ["launch", "recipe=gpt_tiny", "model=custom", "model._target_=boom_model.Boom",
            "model.block_size=16", "train.steps=2"]  # fmt: skip
    run = run_dtrain(args, tmp_path)
    assert run.returncode == 1
    err = run.stderr
    assert "error: rank 0 failed in step 1 (exit code 1): RuntimeError: boom in forward" in err
    assert "traceback in logs/" not in err and "at boom_model.py:10 in forward" in err
    assert 'boom_model.py", line 10, in forward' in err
    assert err.rstrip().splitlines()[-1].startswith("removed ")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.multiproc
def test_a_row_wise_embedding_trains_as_one_process(tmp_path_factory):
    """``embed:rowwise`` (the docs' style for an Embedding: its vocabulary split): torch's
    RowwiseParallel takes its input as split over the last dim, so the token ids were
    all-gathered into a sequence twice as long and step 1 failed on a shape (a new user's
    find). The ids are taken whole, and the curve is one process's."""
    lm = ["recipe=gpt_tiny", "model=custom", "model._target_=own_targets.TinyLM"]
    lm += ["model.block_size=32", "train.steps=3", "logging.every=1", "train.eval_every=0"]
    lm += ["logging.tensorboard=false", "checkpoint.at_end=false"]
    env = {"PYTHONPATH": str(REPO / "tests")}
    tp_plan = "parallel.tp_plan={embed:rowwise,blocks.*.up:colwise,blocks.*.down:rowwise}"
    runs = []
    for name, extra in [("emb-dp1", []), ("emb-tp2", ["tp=2", tp_plan])]:
        run = run_dtrain(["launch", *lm, *extra], tmp_path_factory.mktemp(name), env=env)
        assert run.returncode == 0, f"{name}:\n{run.stderr[-3000:]}"
        runs.append(losses(run))
    assert len(runs[0]) == 3 and runs[1] == pytest.approx(runs[0], rel=1e-5)
