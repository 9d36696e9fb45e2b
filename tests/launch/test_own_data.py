"""Your own data with processes: loader workers give the stream's samples; an hf run killed
mid-epoch and resumed with 2 loader workers equals the uninterrupted run with none, bitwise;
a custom dataset trains under dp=2; the bad datasets a launch refuses. The rest:
tests/unit/test_own_data.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dtrain_cli.config.schema import DataConfig
from dtrain_cli.corpus.custom import build_custom
from dtrain_cli.corpus.hf import prepare_hf
from tests.conftest import Run, cache_dir, run_dtrain
from tests.unit.test_own_data import WITH_TESTS


# -- the loader: the stream decides the samples, not the worker count ------------------------
def _batches(source, workers: int, dp_rank: int = 0):
    import torch

    from dtrain_cli.runtime.data.loader import Batches
    from dtrain_cli.runtime.data.stream import BatchLayout

    layout = BatchLayout(micro_batch_size=3, grad_accum=2, dp=2, dp_rank=dp_rank)
    data = DataConfig(num_workers=workers, prefetch_factor=2 if workers else None)
    return Batches(source, layout, 7, torch.device("cpu"), data)


@pytest.mark.parametrize("target", ["tests.own_data.Pairs", "tests.own_data.DictPairs"])
def test_workers_and_restarts_give_the_stream_samples(target):
    import torch

    from dtrain_cli.runtime.data.stream import SampleStream

    source = build_custom(DataConfig(source="custom", _target_=target, kwargs={"n": 40}))["train"]
    order = [(s, k) for s in range(4) for k in range(2)]
    main, pool, ranked = _batches(source, 0), _batches(source, 2), _batches(source, 2, 1)
    stream = SampleStream(len(source), 7)
    for step, k in order:
        x0, y0 = main.micro_batch(step, k)
        x2, y2 = pool.micro_batch(step, k)
        x0 = x0["inputs"] if isinstance(x0, dict) else x0
        x2 = x2["inputs"] if isinstance(x2, dict) else x2
        assert torch.equal(x0, x2) and torch.equal(y0, y2)
        idx = stream.indices(main.layout.micro_start(step, k), 3)
        want = torch.stack([source[int(i)]["inputs" if "Dict" in target else 0] for i in idx])
        assert torch.equal(x0, want)
        xr, _ = ranked.micro_batch(step, k)  # dp rank 1: the next 3 stream positions
        xr = xr["inputs"] if isinstance(xr, dict) else xr
        assert not torch.equal(xr, x0)
    again, _ = pool.micro_batch(1, 1)  # a restart (resume) at any micro-step
    main.close(), pool.close(), ranked.close()
    ref, _ = _batches(source, 0).micro_batch(1, 1)
    again = again["inputs"] if isinstance(again, dict) else again
    ref = ref["inputs"] if isinstance(ref, dict) else ref
    assert torch.equal(again, ref)


# -- training: hf resume bitwise with loader workers, custom under dp=2 ---------------------
# -- bad input a launch refuses: exit 2, one line, nothing written ----------------------------
# (a launch starts the fork server: its own process; the plan ones: tests/unit/test_own_data.py)
BAD = [
    (["launch", "data=custom", "data._target_=tests.own_data.Stream"], "not a map-style"),
    (["launch", "data=custom", "data._target_=tests.own_data.Failing"], "cannot open shard 1"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_bad_data_exit_2_one_line_nothing_written(args, message, tmp_path):
    argv = [args[0], "recipe=gpt_tiny", *args[1:]]
    run = run_dtrain(argv, tmp_path, 120, WITH_TESTS)
    code, stderr = run.returncode, run.stderr
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert message in lines[0] and "Traceback" not in stderr
    assert not (tmp_path / "runs").exists()


# -- training: hf resume bitwise with loader workers, custom under dp=2 ---------------------
def hf_args(corpus: Path, tok_dir: Path) -> list[str]:
    # ~140 train windows of 33 tokens: 20 steps of 8 samples cross an epoch, so the resume
    # at step 10 is mid-epoch (checked below)
    return [
        "recipe=gpt_tiny",
        "data=hf",
        f"data.path={corpus}",
        f"data.tokenizer={tok_dir}",
        # covers the tokenizer's ~110 tokens; 256 keeps the head's shape that the
        # checkpoint tests resume bitwise (with 108 or 128, main's resume differs by 1 ulp
        # in some steps' loss, with data=tokens on the same token files too)
        "model.vocab_size=256",
        "model.block_size=32",
        "train.steps=20",
        "train.global_batch_size=8",
        "train.micro_batch_size=2",
        "logging.every=1",
        "checkpoint.every_steps=10",
        "train.eval_every=10",
        "optim.warmup_steps=2",
        "logging.tensorboard=false",
        "dp=2",
        "debug.replica_check_at_end=true",  # param_digest in summary.json
    ]


def losses(run: Run, kind: str = "train") -> list[tuple[int, float]]:
    key = "loss" if kind == "train" else "val_loss"
    return [(r["step"], r[key]) for r in run.metrics(kind)]


@pytest.mark.multiproc
def test_hf_resume_mid_epoch_with_workers_is_bitwise(hf_files, tmp_path):
    corpus, tok_dir, _ = hf_files
    args = hf_args(corpus, tok_dir)
    data = DataConfig(source="hf", path=str(corpus), tokenizer=str(tok_dir))
    train = np.fromfile(prepare_hf(data, cache_dir(), 256)["train"], dtype=np.uint16)
    assert 80 < (len(train) - 1) // 32 < 160  # step 10 = sample 80: mid-epoch, then a new one
    for name in ("ref", "killed"):
        (tmp_path / name).mkdir()
    ref = run_dtrain(["launch", *args], tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    killed = run_dtrain(
        ["launch", *args, "data.num_workers=2", "data.prefetch_factor=3"],
        tmp_path / "killed",
        env={"DTRAIN_FAULTS": "kill:step=13:rank=0"},
    )
    assert killed.returncode != 0 and killed.run_dir is not None
    done = run_dtrain(["resume", "--ckpt", str(killed.run_dir)], tmp_path / "killed")
    done.run_dir = killed.run_dir
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.summary()["resumed_from"] == "step_000010"
    assert losses(done) == losses(ref)  # workers and the resume change nothing, bitwise
    assert losses(done, "val") == losses(ref, "val")
    assert done.summary()["param_digest"] == ref.summary()["param_digest"]
    assert losses(ref)[-1][1] < losses(ref)[0][1]
    assert "training data changed" not in done.stdout + done.stderr  # the same data


def test_resume_after_the_data_changed_says_the_samples_differ(tmp_path):
    """A file appended to between save and resume changed the permutation the samples come
    from, and the resume, documented as exact, said nothing (a new user's find)."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    args = ["launch", "recipe=gpt_tiny", "data=text", f"data.path={notes}", "train.steps=4",
            "checkpoint.every_steps=2", "logging.tensorboard=false"]  # fmt: skip
    first = run_dtrain(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = first.run_dir / "checkpoints" / "step_000002"
    saved = json.loads((ckpt / "meta.json").read_text())["train_samples"]
    assert saved == (9000 - max(2, int(9000 * 0.1)) - 1) // 128  # windows of the train split
    same = run_dtrain(["resume", "--ckpt", str(ckpt)], tmp_path)
    assert same.returncode == 0 and "training data changed" not in same.stdout + same.stderr
    assert "token file is not the one" not in same.stdout + same.stderr
    # the same size, other words (sed 's/fox/cat/g'): the sample count cannot tell
    (notes / "a.txt").write_text("the quick brown cat jumps over the lazy dog. " * 200)
    edited = run_dtrain(["resume", "--ckpt", str(ckpt)], tmp_path)
    assert edited.returncode == 0, edited.stderr[-3000:]
    said = " ".join((edited.stdout + edited.stderr).split())
    assert "the training data's token file is not the one step_000002 was saved with" in said
    with (notes / "a.txt").open("a") as f:
        f.write("a sentence more. " * 300)
    changed = run_dtrain(["resume", "--ckpt", str(ckpt)], tmp_path)
    assert changed.returncode == 0, changed.stderr[-3000:]
    said = " ".join((changed.stdout + changed.stderr).split())
    assert (
        f"the training data changed since step_000002 was saved ({saved} samples then, " in said
        and "from step 3 on it draws other samples" in said
    )


@pytest.mark.multiproc
def test_custom_dataset_trains_under_dp2(tmp_path):
    run = run_dtrain(
        [
            "launch",
            "recipe=gpt_tiny",
            "data=custom",
            "data._target_=tests.own_data.Pairs",
            "++data.n=96",
            "++data.block_size=32",
            "model.block_size=32",
            "train.steps=12",
            "train.global_batch_size=8",
            "optim.warmup_steps=2",
            "optim.base_lr=3e-3",
            "logging.every=1",
            "train.eval_every=12",
            "logging.tensorboard=false",
            "debug.replica_check_at_end=true",  # replicas_identical in summary.json
            "data.num_workers=1",
            "dp=2",
        ],
        tmp_path,
        env=WITH_TESTS,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    curve = [loss for _, loss in losses(run)]
    assert len(curve) == 12 and curve[-1] < 0.9 * curve[0]
    summary = run.summary()
    assert summary["replicas_identical"] and np.isfinite(summary["val_loss"])


PROJECT_DATA = """import torch
from torch.utils.data import Dataset


class Counting(Dataset):
    def __init__(self, n: int = 64):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        seq = (torch.arange(33) * (1 + i % 3) + i) % 256
        return seq[:-1], seq[1:]
"""


def test_a_custom_data_run_resumes_from_another_folder(tmp_path):
    """The dataset's module sits in the folder the run was launched from; a resume from its
    parent refused it ('no module ...', searched: the current folder only), though the run
    recorded its import roots (a new user's find)."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "proj_data.py").write_text(PROJECT_DATA)
    args = ["launch", "recipe=gpt_tiny", "data=custom", "data._target_=proj_data.Counting",
            "model.block_size=32", "train.steps=4", "checkpoint.every_steps=2",
            "logging.tensorboard=false"]  # fmt: skip
    first = run_dtrain(args, project)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_dtrain(["resume", str(first.run_dir), "train.steps=6"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming" in again.stderr and "no module" not in again.stderr
