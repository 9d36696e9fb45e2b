"""Synchronized BatchNorm: batch statistics over the whole dp group, not one rank's slice.

    dtrain launch recipe=cnn_bn dp=4 model.sync_bn=true

On CUDA this is torch's ``nn.SyncBatchNorm``. torch's version refuses CPU tensors, so on
CPU/gloo dtrain uses :class:`CPUSyncBatchNorm`, written here because no library provides
it: forward all-reduces (count, sum, sum of squares) in one collective; backward
all-reduces (sum dy, sum dy*x_hat) in one more. Outputs, gradients and running statistics
equal plain BatchNorm on the concatenated global batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


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


class CPUSyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training-mode statistics span ``group`` (eval: running stats)."""

    group: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.group is None:
            return super().forward(x)
        y, mean, var, n = _SyncBatchNormFunction.apply(
            x, self.weight, self.bias, self.eps, self.group
        )
        with torch.no_grad():
            m = self.momentum if self.momentum is not None else 0.1
            self.running_mean.mul_(1 - m).add_(mean, alpha=m)
            self.running_var.mul_(1 - m).add_(var * n / (n - 1), alpha=m)  # unbiased, as torch
            self.num_batches_tracked.add_(1)
        return y


def apply_sync_batchnorm(model: nn.Module, group: Any, device: torch.device) -> nn.Module:
    """Swap every BatchNorm2d for its synchronized version (weights and stats kept)."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, CPUSyncBatchNorm):
            sync = CPUSyncBatchNorm(
                child.num_features,
                child.eps,
                child.momentum,
                child.affine,
                child.track_running_stats,
            )
            sync.load_state_dict(child.state_dict())
            sync.group = group
            setattr(model, name, sync.to(child.weight.device))
        else:
            apply_sync_batchnorm(child, group, device)
    return model
