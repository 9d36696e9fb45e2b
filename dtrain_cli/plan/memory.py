"""Per-rank memory and communication estimates for each data-parallel strategy. Pure.

Memory (fp32 master weights; the runtime measures the real bytes and the run summary
shows both): ddp keeps everything on every rank; zero1 shards the optimizer state over
dp; fsdp shards parameters, gradients and optimizer state (plus one gathered block).
Communication: the gradient payload each rank contributes per step and the bytes a ring
moves per rank for it (2 (n-1)/n x payload for an all-reduce).
"""

from __future__ import annotations

import math

from dtrain_cli.config.schema import DtrainConfig, ModelConfig
from dtrain_cli.plan.layout import (
    activation_bytes_per_layer,
    fsdp_reshards_after_forward,
    params_per_layer,
)
from dtrain_cli.plan.plan import BatchPlan, Estimates

CNN_KERNEL = 3


def count_params(m: ModelConfig) -> int:
    """Parameters of the model the runtime builds (a test checks they agree)."""
    if m.arch == "cnn_bn":
        total, c_in = 0, 3
        for c in m.channels:
            total += c_in * c * CNN_KERNEL * CNN_KERNEL + c + 2 * c  # conv (+bias) + BN affine
            c_in = c
        return total + c_in * m.num_classes + m.num_classes
    d = m.n_embd
    head = 0 if m.tie_embeddings else m.vocab_size * d
    norm = d * (1 + int(m.bias))
    return m.vocab_size * d + m.block_size * d + m.n_layer * params_per_layer(m) + norm + head


def matrix_shapes(m: ModelConfig) -> tuple[list[tuple[int, int]], int]:
    """2-D weight shapes (what PowerSGD compresses) and the count of other parameters."""
    if m.arch == "cnn_bn":
        mats, c_in = [], 3
        for c in m.channels:
            mats.append((c, c_in * CNN_KERNEL * CNN_KERNEL))
            c_in = c
        mats.append((m.num_classes, c_in))
    else:
        d = m.n_embd
        mats = [(m.vocab_size, d), (m.block_size, d)]
        mats += [(d, d)] * 4 * m.n_layer + [(4 * d, d), (d, 4 * d)] * m.n_layer
        if not m.tie_embeddings:
            mats.append((m.vocab_size, d))
    in_mats = sum(a * b for a, b in mats)
    return mats, count_params(m) - in_mats


def grad_payload_bytes(cfg: DtrainConfig) -> int:
    """Bytes of gradient each rank hands to the collective per step, after compression."""
    n = count_params(cfg.model)
    comp = cfg.comm.compression
    if comp in ("fp16", "bf16"):
        return 2 * n
    if comp == "powersgd":
        mats, other = matrix_shapes(cfg.model)
        r = cfg.comm.powersgd_rank
        low_rank = sum(min(a, b, r) * (a + b) if min(a, b) > r else a * b for a, b in mats)
        return 4 * (low_rank + other)
    return 4 * n


def comm_bytes_per_step(cfg: DtrainConfig) -> int:
    """Bytes sent per rank per step over the dp group (ring algorithms)."""
    dp = cfg.parallel.dp
    if dp <= 1 or cfg.sync.mode == "local_sgd":
        # local SGD: a parameter all-reduce every `every` steps, amortized
        if dp > 1:
            return int(2 * (dp - 1) / dp * 4 * count_params(cfg.model) / cfg.sync.every)
        return 0
    ring = (dp - 1) / dp
    n_bytes = 4 * count_params(cfg.model) / max(cfg.parallel.tp * cfg.parallel.pp, 1)
    if cfg.parallel.strategy == "fsdp":
        schedule = cfg.pipeline.schedule if cfg.parallel.pp > 1 else None
        gathers = 2 if fsdp_reshards_after_forward(cfg, schedule) else 1  # fwd (+ bwd)
        return int(ring * n_bytes * (gathers + 1))  # + reduce-scatter of gradients
    payload = grad_payload_bytes(cfg) / max(cfg.parallel.tp * cfg.parallel.pp, 1)
    total = 2 * ring * payload
    if cfg.parallel.strategy == "zero1":
        total += ring * n_bytes  # updated parameter shards broadcast from their owners
    return int(total)


def estimate(cfg: DtrainConfig, batch: BatchPlan) -> Estimates:
    """Per-rank memory (fp32 master weights) and FLOPs per token; estimates, not measurements."""
    m, par = cfg.model, cfg.parallel
    n = count_params(m)
    per_rank = math.ceil(n / (par.tp * par.pp))
    optim_words = {"adamw": 2, "sgd": 1 if cfg.optim.momentum > 0 else 0}[cfg.optim.name]
    params_b, grads_b = 4 * per_rank, 4 * per_rank
    optim_b = 4 * optim_words * per_rank
    if par.strategy in ("zero1", "fsdp"):
        optim_b = math.ceil(optim_b / par.dp)
    if par.strategy == "fsdp":
        block = 4 * params_per_layer(m) if m.arch == "gpt" else 0
        params_b = math.ceil(params_b / par.dp) + block  # shard + one gathered block
        grads_b = math.ceil(grads_b / par.dp)
    b = batch.micro_batch_size
    if m.arch == "gpt":
        logits = b * m.block_size * m.vocab_size * 4 * 2
        activations = int(activation_bytes_per_layer(cfg, b) * m.n_layer / par.pp + logits)
        non_embedding = n - m.block_size * m.n_embd
        flops = 6 * non_embedding + 12 * m.n_layer * m.n_embd * m.block_size
    else:
        pixels = m.image_size * m.image_size
        activations = int(b * pixels * sum(m.channels) * 4 * 3)
        flops = 6 * n * pixels  # per image, rough: every conv weight touches every pixel
    return Estimates(
        num_params=n,
        params_per_rank=per_rank,
        bytes_params=params_b,
        bytes_grads=grads_b,
        bytes_optimizer=optim_b,
        bytes_activations=activations,
        bytes_total=params_b + grads_b + optim_b + activations,
        flops_per_token=flops,
        comm_bytes_per_step=comm_bytes_per_step(cfg),
        grad_payload_bytes=grad_payload_bytes(cfg),
    )
