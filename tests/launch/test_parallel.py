"""Model parallelism on CPU/gloo: tensor parallel, every pipeline schedule, and hybrid
dp x tp x pp meshes train the single-process model (loss curve and final parameters
within 1e-5), and checkpoints move between layouts."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from dtrain_cli.checkpoint import catalog
from dtrain_cli.plan.plan import Plan
from tests.conftest import Run, run_dtrain

pytestmark = pytest.mark.multiproc

# SGD with a constant LR: the schedule does not depend on train.steps, so a 10-step run
# resumed to 15 steps continues the 15-step reference. Global batch 8 = 4 micro-batches of 2.
BASE = [
    "recipe=gpt_tiny",
    "optim=sgd",
    "optim.warmup_steps=0",
    "train.steps=10",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "logging.every=1",
    "train.eval_every=5",
    "logging.tensorboard=false",
]

LAYOUTS = {
    "tp2": ["tp=2"],
    "pp2-gpipe": ["pp=2", "pipeline.schedule=gpipe"],
    "pp2-1f1b": ["pp=2", "pipeline.schedule=1f1b"],
    "pp2-interleaved_1f1b": [
        "pp=2",
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.virtual_stages=2",
    ],
    "pp2-looped_bfs": ["pp=2", "pipeline.schedule=looped_bfs", "pipeline.virtual_stages=2"],
    # interleaved_zb and zbv: with dp=2 in tests/launch/test_pipeline_dp.py (same reference check)
    "pp2-dualpipev": ["pp=2", "pipeline.schedule=dualpipev", "pipeline.virtual_stages=2"],
    "pp4": ["pp=4"],
    "dp2-tp2": ["dp=2", "tp=2"],
    "dp2-pp2": ["dp=2", "pp=2", "train.micro_batch_size=1"],
    "dp2-tp2-pp2": ["dp=2", "tp=2", "pp=2", "train.micro_batch_size=1"],
}


def launch(cwd: Path, *args: str, timeout: float = 300) -> Run:
    run = run_dtrain(["launch", *BASE, *args], cwd, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def final_params(run: Run) -> dict[str, torch.Tensor]:
    """The full model of the run's last checkpoint, consolidated the way `dtrain export` does."""
    from safetensors.torch import load_file

    from dtrain_cli.checkpoint.export import export_model

    ckpt = catalog.newest_complete(run.run_dir)
    assert ckpt is not None
    out = run.run_dir / "final.safetensors"
    export_model(ckpt, out)
    return load_file(str(out))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Run:
    """One process, 15 steps (the resume tests continue to 15)."""
    return launch(tmp_path_factory.mktemp("ref"), "train.steps=15", "checkpoint.every_steps=10")


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory) -> dict[str, Run]:
    return {name: launch(tmp_path_factory.mktemp(name), *args) for name, args in LAYOUTS.items()}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_equals_single_process(name, layout_runs, reference):
    run = layout_runs[name]
    ref_losses = [r["loss"] for r in reference.metrics()][:10]
    losses = [r["loss"] for r in run.metrics()]
    assert len(losses) == 10
    for step, (a, b) in enumerate(zip(losses, ref_losses, strict=True), start=1):
        assert a == pytest.approx(b, rel=1e-5), f"{name} step {step}: {a} vs {b}"
    vals = [r["val_loss"] for r in run.metrics("val")]
    assert vals == pytest.approx([r["val_loss"] for r in reference.metrics("val")][:2], rel=1e-5)
    ref_ckpt = catalog.checkpoints_dir(reference.run_dir) / "step_000010"
    from safetensors.torch import load_file

    from dtrain_cli.checkpoint.export import export_model

    export_model(ref_ckpt, reference.run_dir / "step10.safetensors")
    want = load_file(str(reference.run_dir / "step10.safetensors"))
    got = final_params(run)
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)
    assert run.summary()["world_size"] == Plan.load(run.run_dir / "plan.yaml").world_size


def test_pipeline_summary_reports_measured_and_theoretical_bubble(layout_runs):
    s = layout_runs["pp2-gpipe"].summary()
    plan = Plan.load(layout_runs["pp2-gpipe"].run_dir / "plan.yaml")
    assert s["bubble_theory"] == pytest.approx(1 / 5, abs=1e-4)  # (p-1)/(m+p-1), m=4
    assert plan.pipeline.stages[0].layers == [0, 2] and plan.pipeline.stages[1].layers == [2, 4]
    assert len(s["bubble_measured_per_pp_rank"]) == 2
    assert all(0.0 <= b < 1.0 for b in s["bubble_measured_per_pp_rank"])


def test_mesh_coordinates_match_the_plan_in_3d(layout_runs):
    run = layout_runs["dp2-tp2-pp2"]
    plan = Plan.load(run.run_dir / "plan.yaml")
    for rank in range(8):
        text = (run.run_dir / "logs" / f"rank_{rank}.log").read_text()
        coords = json.loads(re.search(r"mesh coordinates (\{.*\})", text).group(1))
        assert {"rank": rank, **coords} == plan.rank_table()[rank]


@pytest.mark.parametrize(
    ("source", "target"),
    [("dp2-tp2-pp2", ["dp=1", "tp=1", "pp=1"]), ("pp4", ["pp=1", "dp=2", "tp=2"])],
)
def test_checkpoint_moves_between_layouts(source, target, layout_runs, reference, tmp_path):
    src = layout_runs[source].run_dir
    run_dir = tmp_path / "runs" / src.name
    shutil.copytree(src, run_dir)
    done = run_dtrain(
        ["resume", "--ckpt", str(run_dir), "train.steps=15", "train.micro_batch_size=2", *target],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    done.run_dir = run_dir
    got = [r["loss"] for r in done.metrics()]
    want = [r["loss"] for r in reference.metrics()]
    assert len(got) == 15
    assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(
    "layout",
    [["tp=2"], ["dp=2", "tp=2", "parallel.strategy=fsdp"], ["pp=2", "optim.grad_clip=0.5"]],
)
def test_adamw_steps_with_sharded_parameters(layout, tmp_path):
    """AdamW (the recipes' optimizer) over DTensor shards mixed with replicated tensors."""
    run = run_dtrain(
        [
            "launch",
            "recipe=gpt_tiny",
            "train.steps=2",
            "train.global_batch_size=8",
            "train.micro_batch_size=2",
            "optim.warmup_steps=0",
            "logging.tensorboard=false",
            "checkpoint.at_end=false",
            *layout,
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert 0 < run.summary()["final_loss"] < 6.0  # finite, near ln(256) = 5.5 after 2 steps
    assert "warning" not in run.stdout + run.stderr  # e.g. FSDP2's view-output alarm at tp=2
