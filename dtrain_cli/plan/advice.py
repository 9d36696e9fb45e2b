"""What the advisor says: a candidate layout, its verdict (cost or rejection), the advice.

    dtrain advise recipe=gpt_small hardware=h100_80g parallel.nnodes=8 --json

Plain data (:mod:`.advise` searches and costs, :mod:`.advise_render` prints,
:mod:`.advise_compare` explains a layout of yours against #1). Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dtrain_cli.plan.steptime import StepEstimate
from dtrain_cli.strategies import strategy_for


@dataclass(frozen=True, kw_only=True)
class Layout:
    dp: int
    tp: int
    pp: int
    strategy: str
    micro_batch_size: int
    activation_checkpointing: str
    schedule: str | None = None
    virtual_stages: int = 1
    layers_per_stage: tuple[int, ...] | None = None
    """Where the model's layers do not divide the stages: each rank's share as even as
    they allow (:func:`.layout.balanced_split`)."""

    def overrides(self, nnodes: int) -> list[str]:
        out = [
            f"parallel.dp={self.dp}",
            f"parallel.tp={self.tp}",
            f"parallel.pp={self.pp}",
            f"parallel.strategy={self.strategy}",
            f"parallel.activation_checkpointing={self.activation_checkpointing}",
            f"train.micro_batch_size={self.micro_batch_size}",
        ]
        if nnodes > 1:
            out.append(f"parallel.nnodes={nnodes}")
        if self.schedule is not None:
            out += [
                f"pipeline.schedule={self.schedule}",
                f"pipeline.virtual_stages={self.virtual_stages}",
            ]
        if self.layers_per_stage is not None:
            out.append(f"pipeline.layers_per_stage=[{','.join(map(str, self.layers_per_stage))}]")
        return out

    def label(self) -> str:
        parts = [f"dp{self.dp}"] + [
            f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp)) if v > 1
        ]
        text = "x".join(parts) + (f" {self.strategy}" if self.dp > 1 else "")
        if self.schedule is not None:
            text += f" {self.schedule}" + (
                f"/v{self.virtual_stages}" if self.virtual_stages > 1 else ""
            )
        text += " uneven-layers" if self.layers_per_stage else ""
        text += f" mb{self.micro_batch_size}"
        if self.activation_checkpointing != "none":
            text += f" ac={self.activation_checkpointing}"
        return text

    def simplicity(self) -> int:
        """Lower is simpler: the tie-break between layouts of equal throughput."""
        cost = strategy_for(self.strategy).simplicity
        cost += 3 * (self.tp > 1) + 4 * (self.pp > 1)
        return cost + {"none": 0, "selective": 1, "full": 2}[self.activation_checkpointing]


@dataclass(kw_only=True)
class Verdict:
    layout: Layout
    estimate: StepEstimate | None = None
    rejected: str | None = None
    """Why the layout is not ranked (None: it is)."""
    kind: str = ""
    """Rejection kind: plan | memory | cross-node tp | bubble."""
    why: str = ""
    """The one-line reason for its rank."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"layout": self.layout.label(), **dataclasses.asdict(self.layout)}
        if self.estimate is not None:
            est = self.estimate
            m = est.memory
            d["memory_bytes"] = {
                "params": m.params,
                "grads": m.grads,
                "optimizer": m.optimizer,
                "activations": m.activations,
                "temporary": m.temporary,
                "total": m.total,
                "capacity": m.capacity,
            }
            d["links"] = [dataclasses.asdict(x) for x in est.links]
            d |= {
                "bubble": est.bubble,
                "step_s": est.step_s,
                "tokens_per_s": est.tokens_per_s,
                "mfu": est.mfu,
            }
        d["rejected"] = self.rejected
        d["why"] = self.why
        return d


@dataclass(kw_only=True)
class Advice:
    hardware: str
    world_size: int
    nnodes: int
    unit: str
    ranked: list[Verdict] = field(default_factory=list)
    rejected: list[Verdict] = field(default_factory=list)
    reference: Verdict | None = None
    """The layout the user gave (``dtrain advise ... dp=48 tp=8``), costed the same way."""
    reference_why: str = ""
    """Where the given layout stands against #1 (:mod:`.advise_compare`)."""
    activations_estimated: bool = True
    """False: the model's activations are unknown (0 in every estimate): memory and fit are
    without them, and no layout wins or loses on them."""
