"""DiLoCo: ``every`` inner steps per replica with the normal optimizer, then one outer step.

    dtrain launch recipe=gpt_small dp=4 sync.mode=diloco sync.every=16 sync.outer_lr=0.7 \\
        sync.outer_momentum=0.9

After ``every`` inner steps the replicas average their pseudo-gradient ``anchor - params``
(one all-reduce of one flat buffer over the dp group) and an outer Nesterov-momentum SGD
step (``sync.outer_lr``, ``sync.outer_momentum``) moves the shared anchor; every replica
restarts from it. ``every=1, outer_lr=1, outer_momentum=0`` is synchronous data parallel
with an inner SGD step: ``anchor - mean(anchor - p_i) = mean(p_i)``.

The anchors and the outer momentum are the same on every replica; a checkpoint holds
them (``diloco.anchor.*``, ``diloco.momentum.*``) and each replica's own inner parameters
(``diloco.replica_<r>.*``), so a resume between outer steps continues exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dtrain_cli.runtime.sync.base import SyncRuntime


class DiLoCo:
    def __init__(
        self,
        named: list[tuple[str, nn.Parameter]],
        every: int,
        outer_lr: float,
        outer_momentum: float,
        group: Any,
        dp_rank: int,
    ) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.every, self.group, self.dp_rank = every, group, dp_rank
        self.dp = dist.get_world_size(group)
        self.anchors = [p.detach().clone() for p in self.params]
        self.outer = torch.optim.SGD(
            self.anchors,
            lr=outer_lr,
            momentum=outer_momentum,
            nesterov=outer_momentum > 0,
        )
        if outer_momentum > 0:  # zero buffers from the start: the same first step, fixed shapes
            for a in self.anchors:
                self.outer.state[a]["momentum_buffer"] = torch.zeros_like(a)
        self.inner_steps = 0
        self.outer_steps = 0
        self.bytes_sent = 0
        self.last_delta_norm: float | None = None

    def set_step(self, step: int) -> None:
        self.inner_steps = step

    def after_step(self) -> dict[str, float] | None:
        """After the inner optimizer step: every ``every`` steps the outer step. Returns the
        outer step's pseudo-gradient norm when it ran."""
        self.inner_steps += 1
        if self.inner_steps % self.every:
            return None
        with torch.no_grad():
            flat = torch.cat(
                [(a - p).reshape(-1) for a, p in zip(self.anchors, self.params, strict=True)]
            )
            dist.all_reduce(flat, group=self.group)  # the one all-reduce
            flat /= self.dp
            self.bytes_sent += int(2 * (self.dp - 1) / self.dp * 4 * flat.numel())
            pos = 0
            for a in self.anchors:
                a.grad = flat[pos : pos + a.numel()].view_as(a)
                pos += a.numel()
            self.outer.step()
            for a, p in zip(self.anchors, self.params, strict=True):
                p.copy_(a)
                a.grad = None
        self.outer_steps += 1
        return {"outer_step": float(self.outer_steps), "pseudo_grad_norm": float(flat.norm())}

    # -- checkpoint ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, a, p in zip(self.names, self.anchors, self.params, strict=True):
            out[f"anchor.{name}"] = a
            out[f"replica_{self.dp_rank}.{name}"] = p.detach().clone()  # not an alias of model
            buf = self.outer.state.get(a, {}).get("momentum_buffer")
            if buf is not None:
                out[f"momentum.{name}"] = buf
        out["outer_steps"] = torch.tensor(self.outer_steps)
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        """After DCP filled ``state()``'s tensors in place: this replica's own parameters."""
        with torch.no_grad():
            for name, p in zip(self.names, self.params, strict=True):
                p.copy_(state[f"replica_{self.dp_rank}.{name}"])
        self.outer_steps = int(state["outer_steps"])

    def finish(self) -> None:
        """At the end: an outer step over the inner steps since the last one, so that
        every replica ends with the same model."""
        if self.inner_steps % self.every:
            self.inner_steps = self.every * (self.inner_steps // self.every + 1) - 1
            self.after_step()

    def summary(self, steps: int) -> dict[str, Any]:
        return {
            "diloco_outer_steps": self.outer_steps,
            "diloco_bytes_per_step_measured": self.bytes_sent // max(1, steps),
        }


class DiLoCoSync(SyncRuntime):
    """DiLoCo as the loop's sync seam: the outer step after the inner one, its state in
    checkpoints (under ``sync``), its summary at the end."""

    replicas_step_alone = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        s = self.cfg.sync
        self.diloco = DiLoCo(
            self.trainable(), s.every, s.outer_lr, s.outer_momentum, self.ctx.dp_group,
            self.ctx.dp_rank,
        )  # fmt: skip
        self.finished = False

    def state(self) -> dict[str, Any]:
        return self.diloco.state()

    def state_bytes(self) -> int:
        """The anchor parameters and the outer step's momentum buffers."""
        outer = [v for st in self.diloco.outer.state.values() for v in st.values()]
        held = [*self.diloco.anchors, *(v for v in outer if isinstance(v, torch.Tensor))]
        return sum(t.numel() * t.element_size() for t in held)

    def on_resume(self, state: dict[str, Any], step: int) -> None:
        self.diloco.load_state(state)
        self.diloco.set_step(step)

    def after_optimizer_step(self) -> dict[str, float] | None:
        return self.diloco.after_step()

    def finish(self, step: int, run_dir: Path) -> dict[str, Any]:
        if self.finished:
            return {}
        self.finished = True
        self.diloco.finish()
        out = self.diloco.summary(step)
        if self.plan.sync is not None:
            out["bytes_per_step_per_role_estimate"] = self.plan.sync.bytes_per_step
        return out
