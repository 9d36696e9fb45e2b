"""Without loader workers the rank reads its batches itself (runtime/data/loader.py): each
batch equals what ``torch.utils.data.DataLoader(num_workers=0)`` gives for the same indices,
for the built-in token windows, a map-style dataset, one with ``__getitems__`` and dicts,
from the first step and after a restart mid-step."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Subset

from dtrain_cli.config.schema import DataConfig
from dtrain_cli.models.gpt import GPTConfig
from dtrain_cli.runtime.data.loader import Batches, StreamBatches
from dtrain_cli.runtime.data.stream import BatchLayout, open_splits
from tests.own_data import DictPairs, Pairs

LAYOUT = BatchLayout(micro_batch_size=3, grad_accum=2, dp=2, dp_rank=1)


def reference(batches: Batches, step: int, micro: int, count: int) -> list:
    """What torch's single-process loader yields from (step, micro) on."""
    sampler = StreamBatches(batches.stream, batches.layout, step, micro)
    loader = DataLoader(batches.dataset, batch_sampler=sampler, collate_fn=batches.collate)
    it = iter(loader)
    return [next(it) for _ in range(count)]


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and len(a) == len(b) and all(map(equal, a, b))


def check(source) -> None:
    batches = Batches(source, LAYOUT, 7, torch.device("cpu"), DataConfig())
    order = [(s, k) for s in range(5) for k in range(2)]
    want = reference(batches, 0, 0, len(order))
    for (step, k), ref in zip(order, want, strict=True):
        x, y = batches.micro_batch(step, k)
        expected = (ref, ref["targets"]) if isinstance(ref, dict) else tuple(ref)
        assert equal(x, expected[0]) and equal(y, expected[1])
    (ref,) = reference(batches, 2, 1, 1)  # a restart (resume) mid-step
    got = batches.micro_batch(2, 1)
    assert equal(got[0], ref if isinstance(ref, dict) else ref[0])
    assert not hasattr(batches._iter, "_shutdown_workers")  # no DataLoader behind it
    batches.close()


def test_builtin_windows():
    model = GPTConfig(n_layer=1, n_head=1, n_embd=16, block_size=32, vocab_size=256)
    check(open_splits(DataConfig(source="builtin"), model, 7)["train"])


def test_map_style_dict_and_getitems_datasets():
    check(Pairs(n=40, block_size=16))
    check(DictPairs(n=40, block_size=16))
    check(Subset(Pairs(n=50, block_size=16), list(range(3, 43))))  # has __getitems__
