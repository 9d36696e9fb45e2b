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
per node: tp spans tp ranks, dp spans dp*tp, pp the whole world. A collective over a group
that spans nodes moves most of its bytes over NVLink: NCCL's rings and trees cross nodes on
every member's own NIC (one per GPU in HGX/DGX nodes), so the group's bandwidth is
``min(intra, members per node x inter)`` (:func:`group_gbps`).

Step time, calibrated against published large-scale runs (bench/published_cases.yaml: 83
runs of MosaicML llm-foundry, Megatron-LM, Megatron-Core, Calculon's validation set and
torchtitan; bench/RESULTS.md has the table and the errors):

- compute: the plan's FLOPs per token plus the recomputed forwards, at the compute
  efficiency of :func:`compute_efficiency`: ``matmul_efficiency`` (the ceiling large models
  reach) lowered by the memory-bound work a narrow model (small width) or a small
  micro-batch (few tokens per weight read) adds per FLOP;
- the optimizer step: memory-bound, AdamW reads and writes 28 bytes per parameter it
  updates (SGD 12, with momentum 20);
- tensor parallel: all-reduces of the (b, s, d) activations, 4 per block and micro-batch
  (2 forward, 2 backward, 2 more per recomputed block), on the critical path;
- data parallel: ddp/zero1 all-reduce behind backward, fsdp's all-gathers (bf16 under
  autocast, again each micro-batch: gradient accumulation re-gathers) and fp32
  reduce-scatter behind the whole compute, as far as ``comm_overlap`` lets them; only the
  rest and the last call's latency are exposed;
- pipeline: activation sends between stages, of which only those filling and draining
  the pipeline wait (the steady state overlaps them), and the bubble ``(p-1)/(v m + p-1)``
  of the plan (halved for the zero-bubble schedules, which fill most of it with
  weight-gradient passes: bench/RESULTS.md measured zbv at about half). A deeper pipeline
  with the micro-batches to fill it costs its bubble and nothing else, as the published
  Megatron runs show (MFU 42-48% from pp=1 to pp=16).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtrain_cli.config.schema import DtrainConfig, HardwareConfig
from dtrain_cli.models.spec import ModelFacts, ModelSpec
from dtrain_cli.plan.layout import (
    BYTES_PER_ACTIVATION,
    SPLIT_BACKWARD,
    checkpointed_layers,
    fsdp_gathers,
    inflight_microbatches,
    part_activations,
)
from dtrain_cli.plan.memory import optimizer_share
from dtrain_cli.plan.plan import Plan
from dtrain_cli.strategies import strategy_for

GIB = 1024**3

# Memory-bound bytes per FLOP, in the form (constant / width) and (constant / tokens of one
# micro-batch), fitted on bench/published_cases.yaml (bench/calibration_bench.py). Their
# meaning: a transformer block does ~72 d^2 FLOPs per token and its elementwise work
# (norms, activation, residual, dropout, casts) moves ~72 x WIDTH_BYTES_PER_FLOP bytes per
# (token, channel); every weight is read again for each micro-batch (~1 byte per FLOP per
# token of the micro-batch, bf16) plus per-micro-batch launch and scheduling costs.
WIDTH_BYTES_PER_FLOP = 6.0
TOKEN_BYTES_PER_FLOP = 6.0
ZERO_BUBBLE_FACTOR = 0.5  # zbv's measured bubble against (p-1)/(v m+p-1): bench/RESULTS.md


@dataclass(kw_only=True)
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


@dataclass(kw_only=True)
class Link:
    """Bytes one device sends per step on one mesh axis, and over which link."""

    axis: str
    bytes: int
    where: str
    """intra (inside a node) | inter (across nodes)."""
    seconds: float
    exposed_s: float


@dataclass(kw_only=True)
class StepEstimate:
    memory: Memory
    links: list[Link] = field(default_factory=list)
    compute_s: float = 0.0
    recompute_s: float = 0.0
    optimizer_s: float = 0.0
    bubble: float = 0.0
    bubble_s: float = 0.0
    step_s: float = 0.0
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    efficiency: float = 0.0
    """Fraction of the peak the compute runs at (:func:`compute_efficiency`)."""

    def comm_exposed_s(self) -> float:
        return sum(link.exposed_s for link in self.links)

    def shares(self) -> dict[str, float]:
        """Fraction of the step spent on each cost (compute, recompute, comm per axis, bubble)."""
        s = max(self.step_s, 1e-30)
        out = {"compute": self.compute_s / s, "recompute": self.recompute_s / s}
        out["optimizer"] = self.optimizer_s / s
        for link in self.links:
            out[f"{link.axis} comm"] = link.exposed_s / s
        out["bubble"] = self.bubble_s / s
        return out


def placement(span: int, devices_per_node: int) -> str:
    """intra when a group of ``span`` consecutive ranks fits inside one node."""
    return "intra" if span <= devices_per_node and devices_per_node % span == 0 else "inter"


def group_gbps(hw: HardwareConfig, where: str, members_per_node: int = 1) -> float:
    """Bandwidth per member of a collective: NVLink inside a node; across nodes each member
    on a node sends over its own NIC and the rest of the ring runs over NVLink."""
    if where == "intra":
        return hw.intra_node_gbps
    return min(hw.intra_node_gbps, max(members_per_node, 1) * hw.inter_node_gbps)


def _link_time(
    hw: HardwareConfig, where: str, nbytes: float, calls: int, per_node: int = 1
) -> float:
    lat = hw.intra_node_latency_us if where == "intra" else hw.inter_node_latency_us
    return nbytes / max(group_gbps(hw, where, per_node) * 1e9, 1.0) + calls * lat * 1e-6


def compute_efficiency(
    hw: HardwareConfig, width: int, micro_tokens: int, low_precision: bool = True
) -> float:
    """Fraction of the peak a step's compute runs at. An additive roofline: each FLOP costs
    ``1 / (peak * matmul_efficiency)`` plus the memory traffic that goes with it at
    ``memory_gbps``, ``WIDTH_BYTES_PER_FLOP / width + TOKEN_BYTES_PER_FLOP / micro_tokens``
    bytes; so a wide model with big micro-batches reaches ``matmul_efficiency`` and a
    narrow one or a small micro-batch less (MosaicML's A100 table: MFU 45% at width 768,
    60% at 2048, 64% at 4096; bench/published_cases.yaml)."""
    if hw.memory_gbps <= 0 or width <= 0 or micro_tokens <= 0:
        return hw.matmul_efficiency
    ridge = peak_flops(hw, low_precision) / (hw.memory_gbps * 1e9)  # FLOPs per byte
    per_flop = WIDTH_BYTES_PER_FLOP / width + TOKEN_BYTES_PER_FLOP / micro_tokens
    return 1.0 / (1.0 / hw.matmul_efficiency + ridge * per_flop)


def peak_flops(hw: HardwareConfig, low_precision: bool) -> float:
    return (hw.peak_tflops_bf16 if low_precision else hw.peak_tflops_fp32) * 1e12


def peak_memory(cfg: DtrainConfig, spec: ModelSpec, plan: Plan, hw: HardwareConfig) -> Memory:
    """The device that holds the most, at its peak (see the module docstring)."""
    e, par, b = plan.estimates, cfg.parallel, plan.batch
    facts = spec.facts()
    pipe = plan.pipeline
    acts = e.bytes_activations
    if pipe is not None and pipe.stages:
        per_rank: dict[int, float] = {}
        for st in pipe.stages:
            kept, _ = part_activations(
                cfg, spec, b.micro_batch_size, *st.layers, st.embeddings, st.head
            )
            n = inflight_microbatches(
                pipe.schedule, par.pp, pipe.virtual_stages, pipe.microbatches, st.pp_rank
            )
            per_rank[st.pp_rank] = per_rank.get(st.pp_rank, 0.0) + kept * n
        acts = int(max(per_rank.values()))
    acts += e.bytes_recompute
    temporary = e.bytes_gathered + strategy_for(par.strategy).temporary_bytes(
        block_params=facts.params_per_layer, tp=par.tp, dims=plan.dims
    )
    if spec.vocab_size and facts.unit == "tokens":  # the logits' gradient (last stage)
        temporary += b.micro_batch_size * facts.tokens_per_sample * spec.vocab_size * 4
    capacity = int((hw.memory_gib - hw.reserved_gib) * GIB)
    return Memory(
        params=e.bytes_params,
        grads=e.bytes_grads,
        optimizer=e.bytes_optimizer,
        activations=acts,
        temporary=temporary,
        capacity=capacity,
    )


def _width(spec: ModelSpec, facts: ModelFacts) -> int:
    """The model's hidden width: the width a (b, s, d) activation boundary holds."""
    per_token = spec.checkpoint_bytes(1, 1, 1) / max(facts.tokens_per_sample, 1)
    return int(per_token) or int((facts.params_per_layer / 12) ** 0.5)


def tp_link(
    cfg: DtrainConfig, plan: Plan, hw: HardwareConfig, layers: int, boundary: float
) -> Link:
    """Tensor-parallel all-reduces of the (b, s, d) activations, on the critical path."""
    par = cfg.parallel
    recomputed = len(checkpointed_layers(0, layers, par.activation_checkpointing))
    where = placement(par.tp, max(hw.devices_per_node, 1))
    ring = 2 * (par.tp - 1) / par.tp
    calls = (4 + 2 * recomputed / layers) * layers / max(par.pp, 1)
    calls *= plan.batch.grad_accum
    nbytes = ring * boundary * calls
    t = _link_time(hw, where, nbytes, int(calls))
    return Link(axis="tp", bytes=int(nbytes), where=where, seconds=t, exposed_s=t)


def pp_link(cfg: DtrainConfig, plan: Plan, hw: HardwareConfig, boundary: float) -> Link:
    """Activations forward and their gradients back between stages. In the steady state a
    stage receives the next micro-batch while it computes the current one (Narayanan et al.
    2021, sec. 4.1; torch.distributed.pipelining's sends are asynchronous), so
    only the 2 (p-1) hops of filling and draining the pipeline wait for the link, and of
    the rest what ``comm_overlap`` does not hide."""
    g = max(hw.devices_per_node, 1)
    span = cfg.parallel.dp * cfg.parallel.tp  # the next stage is this far away in the mesh
    where = "intra" if span * 2 <= g and g % (span * 2) == 0 else "inter"
    pipe = plan.pipeline
    calls = 2 * pipe.virtual_stages * plan.batch.grad_accum
    nbytes = boundary * calls
    t = _link_time(hw, where, nbytes, calls)
    fill = min(2 * (cfg.parallel.pp - 1) * pipe.calls_per_step, calls) * t / max(calls, 1)
    return Link(
        axis="pp",
        bytes=int(nbytes),
        where=where,
        seconds=t,
        exposed_s=fill + (1 - hw.comm_overlap) * (t - fill),
    )


def dp_link(
    cfg: DtrainConfig,
    plan: Plan,
    hw: HardwareConfig,
    layers: int,
    compute_s: float,
    backward_s: float,
    tensors: int = 0,
) -> Link:
    """Gradient (and parameter) traffic over the dp group, hidden behind compute as far as
    ``comm_overlap`` lets it; the rest and the last call's latency are exposed (``tensors``:
    this rank's parameter tensors)."""
    par, e = cfg.parallel, plan.estimates
    g = max(hw.devices_per_node, 1)
    where = placement(par.dp * par.tp, g)
    per_node = max(1, g // max(par.tp, 1)) if where == "inter" else 1
    gathers, rounds = fsdp_gathers(cfg, plan.batch.grad_accum, plan.pipeline)
    by_size = max(1, int(4 * e.params_per_rank / (cfg.comm.bucket_mb * 2**20)) + 1)
    traffic = strategy_for(par.strategy).dp_traffic(
        param_bytes=4 * e.params_per_rank,
        low_bytes=2 if cfg.precision.name in ("bf16", "fp16") else 4,
        gathers=gathers,
        rounds=rounds,
        units=max(layers // max(par.pp, 1), 1) + 1,
        comm_bytes=e.comm_bytes_per_step,
        buckets=min(by_size, tensors or by_size),  # DDP splits no tensor: a bucket at most
        dims=plan.dims,
    )
    nbytes, calls = traffic.bytes, traffic.calls
    # prefetched gathers hide behind the whole step, bucketed all-reduces behind backward
    hidden = hw.comm_overlap * (compute_s if traffic.hidden_behind == "step" else backward_s)
    t = _link_time(hw, where, nbytes, calls, per_node)
    exposed = max(0.0, t - hidden) + _link_time(hw, where, 0, 1)  # the last call waits
    return Link(axis="dp", bytes=int(nbytes), where=where, seconds=t, exposed_s=min(t, exposed))


def compute_seconds(
    cfg: DtrainConfig, spec: ModelSpec, plan: Plan, hw: HardwareConfig
) -> tuple[float, float]:
    """(seconds, efficiency) of one rank's forward and backward FLOPs per step (without
    recomputation): the attention's score and value products (12 L d s per token, flash
    attention) at ``attention_efficiency``, the rest at :func:`compute_efficiency`. An
    unfused attention (``ModelFacts.score_elements``) runs its products as batched matmuls
    at the matmul efficiency and moves its s x s scores through memory besides
    (:data:`SCORE_PASSES`)."""
    b, e, facts = plan.batch, plan.estimates, spec.facts()
    low = cfg.precision.name in ("bf16", "fp16")
    peak = peak_flops(hw, low)
    width = _width(spec, facts)
    eff = compute_efficiency(hw, width, b.micro_batch_size * facts.tokens_per_sample, low)
    flops = e.flops_per_token * b.tokens_per_step / max(plan.world_size, 1)
    attention = 0.0
    if facts.unit == "tokens" and hw.attention_efficiency > 0 and not facts.score_elements:
        per_token = 12 * facts.num_layers * width * facts.tokens_per_sample
        attention = flops * min(per_token / max(e.flops_per_token, 1), 1.0)
    seconds = (flops - attention) / max(peak * eff, 1.0)
    seconds += attention / max(peak * hw.attention_efficiency, 1.0)
    if facts.score_elements and hw.memory_gbps > 0:
        # a rank's share, as for the FLOPs: its blocks (pp), its heads (tp), its samples (dp)
        samples = b.tokens_per_step / max(facts.tokens_per_sample, 1) / max(plan.world_size, 1)
        moved = facts.score_elements * samples * SCORE_PASSES * (2 if low else 4)
        seconds += moved / (hw.memory_gbps * 1e9)
    seconds *= stage_imbalance(plan)  # every stage waits for the busiest
    return seconds, flops / max(peak * seconds, 1e-30)


def stage_imbalance(plan: Plan) -> float:
    """The busiest pipeline rank's layers over the mean (1 for an even split;
    ``pipeline.layers_per_stage=[3,3,3,15]``: 2.5)."""
    per_rank: dict[int, int] = {}
    for st in plan.pipeline.stages if plan.pipeline is not None else []:
        per_rank[st.pp_rank] = per_rank.get(st.pp_rank, 0) + st.layers[1] - st.layers[0]
    total = sum(per_rank.values())
    return max(per_rank.values()) * len(per_rank) / total if total else 1.0


SCORE_PASSES = 15
"""Times an unfused attention (``gpt.net.math_attention``) reads or writes each score, in
forward and backward: forward writes the scores, masks them in place (read, write),
softmaxes them (read, write) and reads them for the product with v (6); backward writes
their gradient, the softmax's backward reads it and the softmax and writes its own (4),
the mask's backward reads and writes (2), the product with v reads the softmax and the
q and k gradients read the scores' gradient twice (3). Flash attention keeps them on chip."""


def optimizer_seconds(
    cfg: DtrainConfig, facts: ModelFacts, plan: Plan, hw: HardwareConfig
) -> float:
    """The optimizer step, memory-bound: it reads the parameter, its gradient and each fp32
    state word and writes the parameter and the states back (AdamW: 7 words, 28 bytes),
    for the parameters this rank updates (its shard under zero1 and fsdp)."""
    if hw.memory_gbps <= 0:
        return 0.0
    par, optim = cfg.parallel, cfg.optim
    words = {"adamw": 2, "sgd": 1 if optim.momentum > 0 else 0}.get(optim.name, 2)
    updated = plan.estimates.params_per_rank
    updated *= optimizer_share(par.strategy, facts, plan.pipeline, plan.dims)
    return updated * 4 * (3 + 2 * words) / (hw.memory_gbps * 1e9)


def estimate_step(
    cfg: DtrainConfig, spec: ModelSpec, plan: Plan, hw: HardwareConfig
) -> StepEstimate:
    par, b, e = cfg.parallel, plan.batch, plan.estimates
    facts = spec.facts()
    world = max(plan.world_size, 1)
    peak = peak_flops(hw, cfg.precision.name in ("bf16", "fp16"))
    compute_s, eff = compute_seconds(cfg, spec, plan, hw)

    layers = max(facts.num_layers, 1)
    recomputed = len(checkpointed_layers(0, facts.num_layers, par.activation_checkpointing))
    recompute_s = compute_s / 3 * recomputed / layers  # one more forward of those blocks
    backward_s = (compute_s + recompute_s) * 2 / 3
    optimizer_s = optimizer_seconds(cfg, facts, plan, hw)

    bpv = BYTES_PER_ACTIVATION[cfg.precision.name]
    boundary = spec.checkpoint_bytes(b.micro_batch_size, bpv, 1)  # one block's (b, s, d)
    links: list[Link] = []
    if par.tp > 1:
        links.append(tp_link(cfg, plan, hw, layers, boundary))
    if par.pp > 1 and plan.pipeline is not None:
        links.append(pp_link(cfg, plan, hw, boundary))
    if par.dp > 1:
        tensors = -(-len(facts.tensor_sizes) * e.params_per_rank // max(facts.num_params, 1))
        links.append(dp_link(cfg, plan, hw, layers, compute_s + recompute_s, backward_s, tensors))

    busy = compute_s + recompute_s + sum(x.exposed_s for x in links if x.axis in ("tp", "pp"))
    bubble = plan.pipeline.bubble if plan.pipeline is not None else 0.0
    if plan.pipeline is not None and plan.pipeline.schedule in SPLIT_BACKWARD:
        bubble *= ZERO_BUBBLE_FACTOR
    bubble_s = busy * bubble / max(1 - bubble, 1e-9)
    dp_s = sum(x.exposed_s for x in links if x.axis == "dp")
    step_s = busy + bubble_s + dp_s + optimizer_s
    tokens_per_s = b.tokens_per_step / step_s if step_s > 0 else 0.0
    mfu = e.flops_per_token * tokens_per_s / (world * peak) if peak > 0 else 0.0
    return StepEstimate(
        memory=peak_memory(cfg, spec, plan, hw),
        links=links,
        compute_s=compute_s,
        recompute_s=recompute_s,
        optimizer_s=optimizer_s,
        bubble=bubble,
        bubble_s=bubble_s,
        step_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        efficiency=eff,
    )
