"""dp x pp layouts train the single-process model whatever the number of micro-batches per
pipeline call (1-4, the counts small batches and the recipes' defaults give), for each
schedule family: DDP under gpipe/1f1b/interleaved_1f1b, torch's replicate under the
zero-bubble schedules, ZeRO-1, FSDP, several calls per step, and dp x tp x pp once.

    dtrain launch recipe=gpt_tiny dp=2 pp=2 train.global_batch_size=8 train.micro_batch_size=2
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Run, run_dtrain

pytestmark = pytest.mark.multiproc

# SGD at a visible learning rate: a rank that misses a gradient reduction moves the loss
# curve by ~1e-2 within 3 steps, far outside the 1e-5 tolerance.
BASE = [
    "recipe=gpt_tiny",
    "optim=sgd",
    "optim.base_lr=0.1",
    "optim.warmup_steps=0",
    "train.steps=3",
    "logging.every=1",
    "train.eval_batches=1",
    "logging.tensorboard=false",
    "checkpoint.at_end=false",
]
DP_PP = ["dp=2", "pp=2"]
# micro-batches per pipeline call m = global / (dp * micro)
M = {
    1: ["train.global_batch_size=8", "train.micro_batch_size=4"],
    2: ["train.global_batch_size=8", "train.micro_batch_size=2"],
    3: ["train.global_batch_size=12", "train.micro_batch_size=2"],
    4: ["train.global_batch_size=8", "train.micro_batch_size=1"],
}
INTERLEAVED = ["pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"]
# 1f1b needs m >= pp; its m=4 (and dp x tp x pp at m=4) run in tests/launch/test_parallel.py.
LAYOUTS = {
    "gpipe-m1": ["pipeline.schedule=gpipe", *M[1]],
    "gpipe-m2": ["pipeline.schedule=gpipe", *M[2]],
    "gpipe-m3-zero1": ["pipeline.schedule=gpipe", "parallel.strategy=zero1", *M[3]],
    "gpipe-m4": ["pipeline.schedule=gpipe", *M[4]],
    "1f1b-m2": ["pipeline.schedule=1f1b", *M[2]],
    "1f1b-m3": ["pipeline.schedule=1f1b", *M[3]],
    "1f1b-2calls": ["pipeline.microbatches=2", *M[4]],  # 4 micro-batches in 2 calls of 2
    # m=2 and m=4 of the interleaved schedule: the same stage code as m=1 and m=3 (the
    # count only changes the schedule's order, which torch builds), and m=2/m=4 are run
    # by the other families here
    **{f"interleaved_1f1b-m{m}": [*INTERLEAVED, *M[m]] for m in (1, 3)},
    "interleaved_zb-m3": ["pipeline.schedule=interleaved_zb", "pipeline.virtual_stages=2", *M[3]],
    "zbv-m2-fsdp": [
        "pipeline.schedule=zbv",
        "pipeline.virtual_stages=2",
        "parallel.strategy=fsdp",
        *M[2],
    ],
    "tp2-1f1b-m2": ["tp=2", *M[2]],
}


def launch(cwd: Path, *args: str) -> Run:
    run = run_dtrain(["launch", *BASE, *args], cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


class Launches:
    """Runs launched on first use and kept for the module (``-k`` launches only what it
    selects): the dp x pp layouts and one single-process reference per global batch."""

    def __init__(self, tmp: pytest.TempPathFactory) -> None:
        self.tmp = tmp
        self.runs: dict[str, Run] = {}

    def get(self, name: str, *args: str) -> Run:
        if name not in self.runs:
            self.runs[name] = launch(self.tmp.mktemp(name), *args)
        return self.runs[name]

    def layout(self, name: str) -> Run:
        return self.get(name, *DP_PP, *LAYOUTS[name])

    def reference(self, global_batch: str) -> Run:
        return self.get(f"ref{global_batch}", f"train.global_batch_size={global_batch}")


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> Launches:
    return Launches(tmp_path_factory)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_dp_pp_layout_equals_single_process(name, launches):
    batch = next(a for a in LAYOUTS[name] if a.startswith("train.global_batch_size="))
    ref = launches.reference(batch.split("=")[1])
    run = launches.layout(name)
    losses = [r["loss"] for r in run.metrics()]
    want = [r["loss"] for r in ref.metrics()]
    assert len(losses) == 3
    for step, (a, b) in enumerate(zip(losses, want, strict=True), start=1):
        assert a == pytest.approx(b, rel=1e-5), f"{name} step {step}: {a} vs {b}"
    vals = [r["val_loss"] for r in run.metrics("val")]
    assert vals == pytest.approx([r["val_loss"] for r in ref.metrics("val")], rel=1e-5)
    assert len(vals) == 1
