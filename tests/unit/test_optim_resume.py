"""A resume's optimizer: the checkpoint's moments and step counts, this run's config's
hyperparameters and peak LR. `dtrain resume ... optim.weight_decay=0.9 optim.eps=0.1` was
recorded in config.yaml and trained bit-identically to no override (the checkpoint's
param groups came back); `lr=5e-4` logged the new LR while its first step ran at the old
peak, and every later resume ran one step at the checkpoint's stale peak (a user's find)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from dtrain_cli.config.schema import OptimConfig
from dtrain_cli.plan.plan import LRPlan
from dtrain_cli.runtime.state.optim import Optimizers


def _lr(peak: float) -> LRPlan:
    return LRPlan(
        base_lr=peak, base_batch_size=0, scaling="none", peak_lr=peak, warmup_steps=0,
        decay="cosine", min_lr=0.0, steps=20,
    )  # fmt: skip


def _trained(cfg: OptimConfig, lr: LRPlan) -> tuple[nn.Module, Optimizers]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = Optimizers([model], cfg, lr)
    for _ in range(10):
        model(torch.randn(8, 4)).square().mean().backward()
        opt.optimizers[0].step()
        opt.zero_grad()
        opt.scheduler_step()
    return model, opt


def test_a_resume_keeps_the_checkpoints_moments_and_its_own_hyperparameters():
    before = OptimConfig(weight_decay=0.1, eps=1e-8)
    model, saved = _trained(before, _lr(1e-3))
    state = saved.state_dict()
    after = dataclasses.replace(before, weight_decay=0.9, eps=0.1)
    resumed = Optimizers([model], after, _lr(5e-4))
    resumed.load_state_dict(state)
    resumed.lr_step = 10  # as the checkpointer sets it
    decay, no_decay = resumed.optimizers[0].param_groups
    assert (decay["weight_decay"], decay["eps"], no_decay["weight_decay"]) == (0.9, 0.1, 0.0)
    assert decay["initial_lr"] == 5e-4  # the new peak: the next step's LR comes from it
    assert decay["lr"] == resumed.schedulers[0].lr_lambdas[0](10) * 5e-4
    moments = resumed.optimizers[0].state[model.weight]
    assert torch.equal(moments["exp_avg"], saved.optimizers[0].state[model.weight]["exp_avg"])
    assert int(moments["step"]) == 10
