"""Async checkpoints stage into buffers made once (runtime/state/staging.py): every staged
copy equals the state at its save, later in-place changes of the state do not reach it,
the buffers are made once while the layout holds and anew when it changes."""

from __future__ import annotations

import torch

from dtrain_cli.runtime.state.staging import ReusedBuffers


def state(scale: float = 1.0, rows: int = 4) -> dict:
    model = {"w": torch.full((rows, 3), scale), "b": torch.arange(3.0) * scale}
    optim = {"state": {"w": {"step": torch.tensor(2.0), "exp_avg": torch.ones(rows, 3)}}}
    return {"model": model, "optim": {**optim, "param_groups": [{"lr": 0.1, "params": ["w"]}]}}


def flat(sd: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def same(a: dict, b: dict) -> bool:
    fa, fb = flat(a), flat(b)
    return fa.keys() == fb.keys() and all(
        torch.equal(x, fb[k]) if isinstance(x, torch.Tensor) else x == fb[k] for k, x in fa.items()
    )


def test_copies_reuse_the_buffers_and_do_not_follow_the_state():
    stager = ReusedBuffers()
    live = state(1.0)
    first = stager.stage(live)
    assert same(first, state(1.0))
    live["model"]["w"].mul_(5)  # the next optimizer step changes tensors in place
    assert same(first, state(1.0)) and first["model"]["w"] is not live["model"]["w"]
    again = stager.stage(live)
    assert same(again, live)
    assert again["model"]["w"].data_ptr() == first["model"]["w"].data_ptr()  # the same buffer
    live["optim"]["param_groups"][0]["lr"] = 0.05  # plain values: the save's own
    assert stager.stage(live)["optim"]["param_groups"][0]["lr"] == 0.05
    assert stager.made == 1


def test_a_new_layout_makes_new_buffers():
    stager = ReusedBuffers()
    stager.stage(state(rows=4))
    bigger = state(2.0, rows=6)  # never copied into a smaller buffer (copy_ would broadcast)
    assert same(stager.stage(bigger), bigger) and stager.made == 2
    halves = state(3.0, rows=6)
    halves["model"]["b"] = halves["model"]["b"].to(torch.float64)
    assert same(stager.stage(halves), halves) and stager.made == 3
    stager.close()
    assert same(stager.stage(bigger), bigger) and stager.made == 4
