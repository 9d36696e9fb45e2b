"""HSDP launched: a resume at another dp continues the curve (the plan's side:
tests/unit/test_hsdp.py)."""

from __future__ import annotations

import pytest

from tests.conftest import run_dtrain


@pytest.mark.multiproc
def test_resume_at_another_dp_continues_the_curve(tmp_path):
    """hsdp dp=4 (2 x 2) saves at step 3; the rest of the run resumed from it at dp=2 (hsdp
    with one group) trains as the uninterrupted run does (SGD: rounding stays at 1e-5)."""
    base = [
        "recipe=gpt_tiny",
        "optim=sgd",
        "optim.warmup_steps=0",
        "train.steps=6",
        "train.global_batch_size=8",
        "logging.every=1",
        "train.eval_every=0",
        "logging.tensorboard=false",
        "checkpoint.every_steps=3",
        "parallel.strategy=hsdp",
    ]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # the two shard groups hold the same shards: compared every step and at the end
    checks = ["debug.replica_check_every=1", "debug.replica_check_at_end=true"]
    whole = run_dtrain(["launch", *base, "dp=4", "parallel.dp_shard=2", *checks], tmp_path / "a")
    assert whole.returncode == 0, whole.stderr[-2000:]
    summary = whole.summary()
    assert summary["replica_checks"] == 6 and summary["replicas_identical"] is True
    cut = run_dtrain(
        ["launch", *base, "dp=4", "parallel.dp_shard=2", "train.steps=3"], tmp_path / "b"
    )
    assert cut.returncode == 0, cut.stderr[-2000:]
    # the run written first, without --ckpt, as `dtrain checkpoints RUN` takes it
    resumed = run_dtrain(["resume", str(cut.run_dir), "dp=2", "train.steps=6"], tmp_path / "b")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got = {r["step"]: r["loss"] for r in resumed.metrics()}
    want = {r["step"]: r["loss"] for r in whole.metrics()}
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert [got[s] for s in (4, 5, 6)] == pytest.approx([want[s] for s in (4, 5, 6)], rel=1e-5)
