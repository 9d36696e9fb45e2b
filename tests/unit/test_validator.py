"""The val loss's samples (dtrain_cli/runtime/components/validator.py): the first
``train.eval_batches`` global batches of the val split, at most the whole split, each window
once. One process, a world-1 gloo group in this process (no fork)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dtrain_cli.runtime.components.validator import Validator


class Windows:
    """A val split of ``n`` windows whose loss is the window's index: the mean names them."""

    def __init__(self, n: int) -> None:
        self.n, self.fetched = n, []

    def __len__(self) -> int:
        return self.n

    def fetch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        self.fetched += idx.tolist()
        return torch.as_tensor(idx, dtype=torch.float64), torch.zeros(len(idx))


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("windows", "eval_batches", "seen"), [(40, 2, 16), (10, 1000, 8), (3, 4, 4)]
)
def test_the_val_loss_reads_each_window_once_and_stops_at_the_splits_end(
    windows, eval_batches, seen, world_of_one
):
    """train.eval_batches=1000 on a 10-window split counted windows again and again past its
    end, some more often than others (a new user's find: 'capped silently'). A split shorter
    than a micro-batch is one micro-batch, wrapped."""
    micro, batch = 4, 8
    plan = SimpleNamespace(
        batch=SimpleNamespace(micro_batch_size=micro, dp=1, global_batch_size=batch),
        pipeline=None,
        steps=10,
    )
    cfg = SimpleNamespace(train=SimpleNamespace(eval_every=5, eval_batches=eval_batches))
    ctx = SimpleNamespace(device=torch.device("cpu"), dp_rank=0)
    step = SimpleNamespace(eval_loss=lambda x, y: x.mean())
    split = Windows(windows)
    model = SimpleNamespace(train=lambda mode: None)
    loss = Validator(cfg, plan, ctx, model, step, split, reports_loss=True).validate()
    assert len(split.fetched) == seen
    if windows >= micro:
        assert len(set(split.fetched)) == seen  # each once
    assert loss == pytest.approx(np.mean(split.fetched))
