"""Optimizer and the plan's learning-rate schedule (``LRPlan.lr_at``) as a torch scheduler."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from dtrain_cli.config.schema import OptimConfig
from dtrain_cli.plan.plan import LRPlan


def build_optimizer(model: nn.Module, cfg: OptimConfig, peak_lr: float) -> torch.optim.Optimizer:
    """AdamW or SGD; weight decay only on matrices (not biases, norms)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=peak_lr, momentum=cfg.momentum)
    return torch.optim.AdamW(
        groups, lr=peak_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True
    )


class LRFactor:
    """Multiplier of the peak lr at a step; a picklable object so the scheduler's
    state_dict stays plain data."""

    def __init__(self, lr: LRPlan) -> None:
        self.lr = lr

    def __call__(self, step: int) -> float:
        return self.lr.lr_at(step) / self.lr.peak_lr


def build_scheduler(optimizer: torch.optim.Optimizer, lr: LRPlan) -> LambdaLR:
    return LambdaLR(optimizer, lr_lambda=LRFactor(lr))
