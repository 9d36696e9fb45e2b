"""Per-device memory at the peak, bytes per step on each link, and an estimated step time
for one planned layout on one kind of hardware (``configs/hardware/*.yaml``). Pure, torch-free.

    dtrain advise recipe=gpt_small hardware=cpu --top 5

Memory: the plan's parameters, gradients and optimizer state (:mod:`.memory`), the plan's
activations of one micro-batch times the micro-batches a pipeline schedule holds at once
(:func:`.layout.inflight_microbatches`), the recomputed block under checkpointing, and
temporary buffers (FSDP's prefetched block and its gradient before the reduce-scatter, the
fp32 gradient of the logits in backward).

Links: the mesh is (pp, dp, tp) with tp innermost (:data:`.plan.MESH_DIM_NAMES`), so a
group of ``span`` consecutive ranks stays inside a node when ``span`` divides the devices
per node: tp spans tp ranks, dp spans dp*tp, pp the whole world.

Step time: compute at ``peak * matmul_efficiency`` (the plan's FLOPs per token, plus the
recomputed forwards), tensor-parallel all-reduces on the critical path, data-parallel
traffic hidden behind backward (ddp, zero1) or behind the whole step (fsdp prefetch), as
far as the hardware's ``comm_overlap`` lets it, and only the rest exposed, pipeline sends
and the bubble ``(p-1)/(v m + p-1)`` on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtrain_cli.config.schema import DtrainConfig, HardwareConfig
from dtrain_cli.models.spec import ModelSpec
from dtrain_cli.plan.layout import (
    BYTES_PER_ACTIVATION,
    checkpointed_layers,
    inflight_microbatches,
    part_activations,
)
from dtrain_cli.plan.plan import Plan

GIB = 1024**3


@dataclass
class Memory:
    """Bytes per device at the peak, by part, against the device's capacity."""

    params: int
    grads: int
    optimizer: int
    activations: int
    temporary: int
    capacity: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.temporary

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass
class Link:
    """Bytes one device sends per step on one mesh axis, and over which link."""

    axis: str
    bytes: int
    where: str
    """intra (inside a node) | inter (across nodes)."""
    seconds: float
    exposed_s: float


@dataclass
class StepEstimate:
    memory: Memory
    links: list[Link] = field(default_factory=list)
    compute_s: float = 0.0
    recompute_s: float = 0.0
    bubble: float = 0.0
    bubble_s: float = 0.0
    step_s: float = 0.0
    tokens_per_s: float = 0.0
    mfu: float = 0.0

    def comm_exposed_s(self) -> float:
        return sum(link.exposed_s for link in self.links)

    def shares(self) -> dict[str, float]:
        """Fraction of the step spent on each cost (compute, recompute, comm per axis, bubble)."""
        s = max(self.step_s, 1e-30)
        out = {"compute": self.compute_s / s, "recompute": self.recompute_s / s}
        for link in self.links:
            out[f"{link.axis} comm"] = link.exposed_s / s
        out["bubble"] = self.bubble_s / s
        return out


def placement(span: int, devices_per_node: int) -> str:
    """intra when a group of ``span`` consecutive ranks fits inside one node."""
    return "intra" if span <= devices_per_node and devices_per_node % span == 0 else "inter"


def _link_time(hw: HardwareConfig, where: str, nbytes: float, calls: int) -> float:
    gbps = hw.intra_node_gbps if where == "intra" else hw.inter_node_gbps
    lat = hw.intra_node_latency_us if where == "intra" else hw.inter_node_latency_us
    return nbytes / max(gbps * 1e9, 1.0) + calls * lat * 1e-6


def peak_memory(cfg: DtrainConfig, spec: ModelSpec, plan: Plan, hw: HardwareConfig) -> Memory:
    """The device that holds the most, at its peak (see the module docstring)."""
    e, par, b = plan.estimates, cfg.parallel, plan.batch
    facts = spec.facts()
    pipe = plan.pipeline
    acts = e.bytes_activations
    if pipe is not None and pipe.stages:
        per_rank: dict[int, float] = {}
        for st in pipe.stages:
            kept, _ = part_activations(cfg, spec, b.micro_batch_size, *st.layers, st.head)
            n = inflight_microbatches(
                pipe.schedule, par.pp, pipe.virtual_stages, pipe.microbatches, st.pp_rank
            )
            per_rank[st.pp_rank] = per_rank.get(st.pp_rank, 0.0) + kept * n
        acts = int(max(per_rank.values()))
    acts += e.bytes_recompute
    temporary = 0
    if par.strategy == "fsdp" and par.dp > 1:
        temporary += 2 * 4 * facts.params_per_layer // max(par.tp, 1)  # prefetch + grad
    if spec.vocab_size and facts.unit == "tokens":  # the logits' gradient (last stage)
        temporary += b.micro_batch_size * facts.tokens_per_sample * spec.vocab_size * 4
    capacity = int((hw.memory_gib - hw.reserved_gib) * GIB)
    return Memory(e.bytes_params, e.bytes_grads, e.bytes_optimizer, acts, temporary, capacity)


def estimate_step(
    cfg: DtrainConfig, spec: ModelSpec, plan: Plan, hw: HardwareConfig
) -> StepEstimate:
    par, b, e = cfg.parallel, plan.batch, plan.estimates
    facts = spec.facts()
    world = max(plan.world_size, 1)
    g = max(hw.devices_per_node, 1)
    low = cfg.precision.name in ("bf16", "fp16")
    peak = (hw.peak_tflops_bf16 if low else hw.peak_tflops_fp32) * 1e12
    rate = max(peak * hw.matmul_efficiency, 1.0)

    flops = e.flops_per_token * b.tokens_per_step / world
    layers = max(facts.num_layers, 1)
    recomputed = len(checkpointed_layers(0, facts.num_layers, par.activation_checkpointing))
    compute_s = flops / rate
    recompute_s = compute_s / 3 * recomputed / layers  # one more forward of those blocks
    backward_s = (compute_s + recompute_s) * 2 / 3

    links: list[Link] = []
    micro_per_rank = b.grad_accum  # micro-batches each rank runs per step
    bpv = BYTES_PER_ACTIVATION[cfg.precision.name]
    boundary = spec.checkpoint_bytes(b.micro_batch_size, bpv, 1)  # one block's (b, s, d)
    if par.tp > 1:
        where = placement(par.tp, g)
        ring = 2 * (par.tp - 1) / par.tp
        per_rank_layers = facts.num_layers / max(par.pp, 1)
        calls = (4 + 2 * recomputed / layers) * per_rank_layers * micro_per_rank
        nbytes = ring * boundary * calls
        t = _link_time(hw, where, nbytes, int(calls))
        links.append(Link("tp", int(nbytes), where, t, t))  # on the critical path
    if par.pp > 1 and plan.pipeline is not None:
        where = placement(world, g)
        v = plan.pipeline.virtual_stages
        calls = 2 * v * micro_per_rank  # activation forward, its gradient back, per stage
        nbytes = boundary * calls
        t = _link_time(hw, where, nbytes, calls)
        links.append(Link("pp", int(nbytes), where, t, t))
    if par.dp > 1:
        where = placement(par.dp * par.tp, g)
        nbytes = e.comm_bytes_per_step
        if par.strategy == "fsdp":
            calls = 3 * max(facts.num_layers // max(par.pp, 1), 1) + 2
            t = _link_time(hw, where, nbytes, calls)
            hidden = hw.comm_overlap * (compute_s + recompute_s)  # prefetched: whole step
        else:
            buckets = max(1, int(4 * e.params_per_rank / (cfg.comm.bucket_mb * 2**20)) + 1)
            t = _link_time(hw, where, nbytes, buckets + (1 if par.strategy == "zero1" else 0))
            hidden = hw.comm_overlap * backward_s
        exposed = max(0.0, t - hidden) + _link_time(hw, where, 0, 1)  # the last call waits
        links.append(Link("dp", int(nbytes), where, t, min(t, exposed)))

    busy = compute_s + recompute_s + sum(x.exposed_s for x in links if x.axis in ("tp", "pp"))
    bubble = plan.pipeline.bubble if plan.pipeline is not None else 0.0
    bubble_s = busy * bubble / max(1 - bubble, 1e-9)
    step_s = busy + bubble_s + sum(x.exposed_s for x in links if x.axis == "dp")
    tokens_per_s = b.tokens_per_step / step_s if step_s > 0 else 0.0
    mfu = e.flops_per_token * tokens_per_s / (world * peak) if peak > 0 else 0.0
    return StepEstimate(
        memory=peak_memory(cfg, spec, plan, hw),
        links=links,
        compute_s=compute_s,
        recompute_s=recompute_s,
        bubble=bubble,
        bubble_s=bubble_s,
        step_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
    )
