"""Optimizers and the plan's learning-rate schedule (``LRPlan.lr_at``) as torch schedulers.

One optimizer per model part (pipeline stages on this rank), as torchtitan does, so
optimizer state is keyed by the full model's parameter names and reshards between layouts.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from dtrain_cli.config.schema import OptimConfig
from dtrain_cli.plan.plan import LRPlan
from dtrain_cli.runtime.parallel.dtensors import full_tensor, is_dtensor, local_tensor

# torch.distributed.checkpoint (about 0.7 s to import) is imported where a checkpoint is
# saved or loaded, not before the first step.


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, peak_lr: float, zero_group: Any | None = None
) -> torch.optim.Optimizer:
    """AdamW or SGD; weight decay only on matrices (not biases, norms). With ``zero_group``
    the optimizer state is sharded over that group (ZeRO-1, ``ZeroRedundancyOptimizer``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if cfg.name == "sgd":
        cls: type[torch.optim.Optimizer] = torch.optim.SGD
        kwargs: dict[str, Any] = {"lr": peak_lr, "momentum": cfg.momentum}
    else:
        cls = torch.optim.AdamW
        # foreach kernels are faster but cannot mix plain tensors and DTensors (tensor
        # parallel keeps norms replicated as plain tensors): per-tensor loop then
        sharded = any(is_dtensor(p) for p in params)
        kwargs = {
            "lr": peak_lr,
            "betas": (cfg.beta1, cfg.beta2),
            "eps": cfg.eps,
            "foreach": not sharded,
        }
    if zero_group is None:
        return cls(groups, **kwargs)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=zero_group, **kwargs)


class LRFactor:
    """Multiplier of the peak lr at a step; a picklable object so the scheduler's
    state_dict stays plain data."""

    def __init__(self, lr: LRPlan) -> None:
        self.lr = lr

    def __call__(self, step: int) -> float:
        return self.lr.lr_at(step) / self.lr.peak_lr


def build_scheduler(optimizer: torch.optim.Optimizer, lr: LRPlan) -> LambdaLR:
    return LambdaLR(optimizer, lr_lambda=LRFactor(lr))


def group_by_mesh(tensors: list[torch.Tensor]) -> dict[Any, list[torch.Tensor]]:
    """Plain tensors under ``None``, DTensors by their device mesh (reductions and foreach
    kernels cannot mix them)."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for t in tensors:
        key = (id(t.device_mesh), t.placements) if is_dtensor(t) else None
        groups.setdefault(key, []).append(t)
    return groups


def grad_norm(params: list[nn.Parameter], pp_group: Any | None) -> torch.Tensor:
    """Global L2 norm of all gradients: DTensor shards (tensor parallel / FSDP) reduced by
    DTensor, plain tensors locally, and the stages of a pipeline summed over ``pp_group``."""
    grads = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), device=device)
    for group in group_by_mesh(grads).values():
        norm = torch.nn.utils.get_total_norm(group, foreach=True)
        sq = sq + full_tensor(norm) ** 2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    return sq.sqrt()


class Optimizers:
    """The optimizers (one per model part) and their LR schedulers, stepped together."""

    def __init__(
        self, parts: list[nn.Module], cfg: OptimConfig, lr: LRPlan, zero_group: Any | None = None
    ) -> None:
        self.parts = parts
        self.optimizers = [build_optimizer(p, cfg, lr.peak_lr, zero_group) for p in parts]
        self.schedulers = [build_scheduler(o, lr) for o in self.optimizers]
        self.params = [p for o in self.optimizers for g in o.param_groups for p in g["params"]]
        self.plain_params = not any(is_dtensor(p) for p in self.params)
        """No DTensor parameters (no tensor parallel / FSDP): torch's clip_grad_norm_ applies."""

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)

    def scheduler_step(self) -> None:
        for s in self.schedulers:
            s.step()

    def step_elsewhere(self) -> None:
        """The update runs on parameter servers: these optimizers never step, their
        schedulers still count the LR the servers apply, and torch's warning that a
        scheduler stepped before its optimizer ("Detected call of lr_scheduler.step()
        before optimizer.step()") does not apply."""
        for o in self.optimizers:
            o._opt_called = True  # type: ignore[attr-defined]  # what LRScheduler reads

    @property
    def lr_step(self) -> int:
        return self.schedulers[0].last_epoch

    @lr_step.setter
    def lr_step(self, step: int) -> None:
        for opt, sched in zip(self.optimizers, self.schedulers, strict=True):
            sched.last_epoch = step
            for group, factor in zip(opt.param_groups, sched.lr_lambdas, strict=True):
                group["lr"] = group["initial_lr"] * factor(step)

    def state_dict(self) -> dict[str, Any]:
        """Flattened, keyed by full-model parameter names (merged over parts); a ZeRO rank
        contributes the entries of the parameters it owns, in the same format."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        out: dict[str, Any] = {}
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            if is_zero(opt):
                out.update(zero_state_dict(part, opt))
            else:
                out.update(get_optimizer_state_dict(part, opt, options=flat_options()))
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The checkpoint's state (moments, step counts); the hyperparameters stay this
        run's config's (a resume's ``optim.weight_decay=...`` was recorded and not applied),
        its peak LR too (``initial_lr``, from which :attr:`lr_step` sets each step's LR: the
        checkpoint's ran the first steps after ``lr=...`` at the old peak), and how this
        layout runs the optimizer (``foreach`` saved without tensor parallel cannot mix the
        plain tensors and DTensors of a tp layout)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        for part, opt in zip(self.parts, self.optimizers, strict=True):
            local = opt.optim if is_zero(opt) else opt
            mine = [{k: v for k, v in g.items() if k != "params"} for g in local.param_groups]
            if is_zero(opt):
                load_zero_state_dict(part, opt, state)
            else:
                set_optimizer_state_dict(part, opt, optim_state_dict=state, options=flat_options())
            for group, kept in zip(local.param_groups, mine, strict=True):
                group.update(kept)  # the loaded groups are new dicts

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its shard under ZeRO / FSDP)."""
        total = 0
        for opt in self.optimizers:
            local = opt.optim if is_zero(opt) else opt
            for st in local.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        t = local_tensor(v)
                        total += t.numel() * t.element_size()
        return total


def flat_options() -> Any:
    """DCP state-dict options: optimizer state flattened to ``state.<fqn>.<key>``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def is_zero(opt: torch.optim.Optimizer) -> bool:
    return type(opt).__name__ == "ZeroRedundancyOptimizer"


def param_names(part: nn.Module) -> dict[nn.Parameter, str]:
    """Parameter -> full-model name (wrapper prefixes such as DDP's ``module.`` removed)."""
    names = {}
    for name, p in part.named_parameters():
        names[p] = ".".join(s for s in name.split(".") if s not in ("module", "_orig_mod"))
    return names


def zero_state_dict(part: nn.Module, zero: Any) -> dict[str, Any]:
    """The ZeRO shard in the flattened format of ``get_optimizer_state_dict``:
    ``state.<fqn>.<key>`` and ``param_groups.<fqn>.<hyperparameter>``."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    local = zero.optim
    _init_optim_state(local)
    names, out = param_names(part), {}
    for group in local.param_groups:
        for p in group["params"]:
            for k, v in local.state[p].items():
                out[f"state.{names[p]}.{k}"] = v
            for k, v in group.items():
                if k != "params":
                    out[f"param_groups.{names[p]}.{k}"] = v
    return out


def load_zero_state_dict(part: nn.Module, zero: Any, state: dict[str, Any]) -> None:
    current = zero_state_dict(part, zero)  # the shapes and references to fill
    for key, value in current.items():
        new = state[key]
        if isinstance(value, torch.Tensor):
            value.copy_(new)
    local, names = zero.optim, param_names(part)
    for group in local.param_groups:
        for k in group:
            if k != "params" and group["params"]:
                group[k] = state[f"param_groups.{names[group['params'][0]]}.{k}"]
