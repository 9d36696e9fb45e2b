"""The meta-device build and its replay (dtrain_cli/runtime/parallel/materialize.py): a
pipeline stage's parameters get the full build's values, bit for bit."""

from __future__ import annotations

import torch
from torch import nn

from dtrain_cli.runtime.parallel.materialize import deferred_build, replay_init


class Replacing(nn.Module):
    """A constructor that replaces its layers and ties one: each replacement frees the
    meta parameters of the layer before, whose storage addresses later ones take."""

    def __init__(self) -> None:
        super().__init__()
        for width in range(8, 40):
            self.head = nn.Linear(width, 64)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(24))
        self.out = nn.Linear(39, 64, bias=False)
        self.out.weight = self.head.weight


class Spec:
    def build(self, device: str) -> nn.Module:
        return Replacing()


def test_replay_after_replaced_layers_gives_the_full_builds_values():
    """It was a shape out of bounds at a pp=2 start-up, or another layer's values: the ops
    recorded for a freed parameter went to the next one at its address."""
    torch.manual_seed(7)
    want = Replacing().state_dict()
    model, record = deferred_build(Spec(), 7)
    assert all(p.is_meta for p in model.parameters())
    assert replay_init([model], record, torch.device("cpu"))
    got = model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
