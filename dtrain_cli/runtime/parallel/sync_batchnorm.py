"""Synchronized BatchNorm: batch statistics over the whole dp group, not one rank's slice.

    dtrain launch recipe=cnn_bn dp=4 parallel.sync_batchnorm=true

On CUDA this is torch's ``nn.SyncBatchNorm``. torch's version refuses CPU tensors, so on
CPU/gloo dtrain uses :class:`CPUSyncBatchNorm`, written here because no library provides
it: forward all-reduces (count, sum, sum of squares) in one collective; backward
all-reduces (sum dy, sum dy*x_hat) in one more. Any BatchNorm (1-d, 2-d, 3-d) of any model
is converted (``parallel.sync_batchnorm=true``). Outputs, gradients and running statistics
equal plain BatchNorm on the concatenated global batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        eps: float,
        group: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dims = [0, *range(2, x.dim())]
        count = torch.tensor([x.numel() / x.shape[1]], dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        dist.all_reduce(stats, group=group)
        c = x.shape[1]
        n = stats[-1]
        mean = stats[:c] / n
        var = (stats[c : 2 * c] / n - mean * mean).clamp_min(0)  # biased, as BN normalizes
        invstd = torch.rsqrt(var + eps)
        shape = [1, c] + [1] * (x.dim() - 2)
        x_hat = (x - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.mark_non_differentiable(mean, var, n)
        ctx.n, ctx.group, ctx.shape, ctx.dims = n, group, shape, dims
        return x_hat * weight.view(shape) + bias.view(shape), mean, var, n

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, *_: Any) -> tuple[Any, ...]:  # type: ignore[override]
        x_hat, weight, invstd = ctx.saved_tensors
        shape, dims = ctx.shape, ctx.dims
        grad_out = grad_out.contiguous()
        sum_dy = grad_out.sum(dims)
        sum_dy_xhat = (grad_out * x_hat).sum(dims)
        grad_weight, grad_bias = sum_dy_xhat.clone(), sum_dy.clone()  # local: DDP averages
        both = torch.cat([sum_dy, sum_dy_xhat])
        dist.all_reduce(both, group=ctx.group)
        c = x_hat.shape[1]
        mean_dy, mean_dy_xhat = both[:c] / ctx.n, both[c:] / ctx.n
        grad_x = (weight * invstd).view(shape) * (
            grad_out - mean_dy.view(shape) - x_hat * mean_dy_xhat.view(shape)
        )
        return grad_x, grad_weight, grad_bias, None, None


class CPUSyncBatchNorm(_BatchNorm):
    """A BatchNorm (1-d, 2-d or 3-d input) whose training-mode statistics span ``group``;
    eval mode uses the (synchronized) running statistics, as torch's ``SyncBatchNorm``."""

    group: Any = None

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (N, C, ...), got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training or self.group is None:
            return super().forward(x)
        c = x.shape[1]
        weight = self.weight if self.affine else torch.ones(c, dtype=x.dtype, device=x.device)
        bias = self.bias if self.affine else torch.zeros(c, dtype=x.dtype, device=x.device)
        y, mean, var, n = _SyncBatchNormFunction.apply(x, weight, bias, self.eps, self.group)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running_stats(mean, var, n)
        return y

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, n: torch.Tensor) -> None:
        self.num_batches_tracked.add_(1)
        # momentum=None: a cumulative average, as torch's BatchNorm
        m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - m).add_(mean, alpha=m)
        self.running_var.mul_(1 - m).add_(var * n / (n - 1), alpha=m)  # unbiased, as torch


def apply_sync_batchnorm(model: nn.Module, group: Any, device: torch.device) -> nn.Module:
    """Every BatchNorm (1-d, 2-d, 3-d) synchronized over ``group``, weights and running
    statistics kept: torch's ``SyncBatchNorm.convert_sync_batchnorm`` on CUDA, the CPU
    version above on gloo."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    if isinstance(model, _BatchNorm) and not isinstance(model, CPUSyncBatchNorm | nn.SyncBatchNorm):
        return _synchronized(model, group)
    for name, child in list(model.named_children()):
        setattr(model, name, apply_sync_batchnorm(child, group, device))
    return model


def _synchronized(bn: _BatchNorm, group: Any) -> CPUSyncBatchNorm:
    sync = CPUSyncBatchNorm(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
    sync.load_state_dict(bn.state_dict())
    sync.train(bn.training)
    sync.group = group
    weight = bn.weight if bn.affine else bn.running_mean
    if weight is not None:
        sync.to(weight.device)
    if bn.affine:  # the same Parameter objects' flags (frozen BN stays frozen)
        sync.weight.requires_grad_(bn.weight.requires_grad)
        sync.bias.requires_grad_(bn.bias.requires_grad)
    return sync
