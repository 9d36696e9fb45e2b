"""Activation checkpointing and the plan's activation estimate, against what torch does, in
one process: the bytes autograd keeps for backward, counted exactly with saved-tensor hooks
(``SavedTensorMeter``), against the plan's estimate (fp32: within 2 %); gradients and
parameter names unchanged by checkpointing. Multi-process (loss curves, the runtime's
measured parameter and optimizer bytes): tests/launch/test_activation_checkpoint.py.
"""

from __future__ import annotations

import pytest
import torch

from dtrain_cli.config.compose import compose_config
from dtrain_cli.models import model_spec
from dtrain_cli.models.losses import cross_entropy
from dtrain_cli.plan.build import Resources, build_plan
from dtrain_cli.plan.layout import checkpointed_layers, part_activations
from dtrain_cli.runtime.parallel.activation_checkpoint import (
    SavedTensorMeter,
    apply_activation_checkpointing,
)

CPU = Resources(num_gpus=0, num_cpus=2)


MICRO = 3  # odd, so no term of the estimate can hide behind a factor of 2


TOLERANCE = 0.02  # fp32: the estimate counts every tensor; 2 % covers allocator rounding


def _overrides(mode: str, *extra: str) -> list[str]:
    return [
        f"parallel.activation_checkpointing={mode}",
        f"train.micro_batch_size={MICRO}",
        f"train.global_batch_size={2 * MICRO}",
        *extra,
    ]


def _model(mode: str, *extra: str):
    cfg = compose_config("gpt_tiny", _overrides(mode, *extra), validate=False)
    spec = model_spec(cfg)
    torch.manual_seed(0)
    model = spec.build("cpu")
    apply_activation_checkpointing(model, spec.blocks(model), mode)
    return cfg, spec, model


def _batch(cfg, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    shape = (MICRO, cfg.model.block_size)
    x = torch.randint(0, cfg.model.vocab_size, shape, generator=g)
    return x, torch.randint(0, cfg.model.vocab_size, shape, generator=g)


def _measure(model, blocks, x, y) -> tuple[int, torch.Tensor]:
    with SavedTensorMeter(model, blocks) as meter:
        loss = cross_entropy(model(x), y)
    return meter.bytes, loss


def test_selective_is_every_other_block_of_the_whole_model():
    assert checkpointed_layers(0, 8, "selective") == [1, 3, 5, 7]
    assert checkpointed_layers(3, 6, "selective") == [3, 5]  # a stage holding layers 3-5
    assert checkpointed_layers(0, 4, "full") == [0, 1, 2, 3]
    assert checkpointed_layers(0, 4, "none") == []


@pytest.mark.parametrize("attention", ["sdpa", "math"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_saved_activation_bytes_match_the_estimate(mode, attention):
    """model.attention=math keeps each block's softmax, b x heads x s x s (a third of the
    block's bytes at gpt_tiny's s = d = 128), where SDPA keeps its log-sum-exp."""
    cfg, spec, model = _model(mode, f"model.attention={attention}")
    x, y = _batch(cfg)
    measured, _ = _measure(model, spec.blocks(model), x, y)
    kept, _ = part_activations(cfg, spec, MICRO, 0, cfg.model.n_layer, True, True)
    assert measured == pytest.approx(kept, rel=TOLERANCE)
    plan = build_plan(cfg, CPU)  # the plan reports the same number
    assert plan.estimates.bytes_activations == kept


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["none", "full"])
def test_dropout_masks_match_the_estimate(mode, precision):
    """model.dropout > 0 keeps a one-byte mask after the embeddings, the attention and the
    MLP, and under math attention the softmax's mask and its dropped-out copy: Megatron-LM's
    GPTs trained with dropout 0.1, and the estimate without them was 40% low at 18B
    (a layout the advisor chose would not have fit). SDPA's CPU kernel has no dropout and
    falls back to the written-out attention; on CUDA flash keeps its RNG state only."""
    extra = ["model.attention=math", "model.dropout=0.1"]
    if precision == "bf16":
        extra += ["precision=bf16", "parallel.strategy=fsdp"]
    cfg, spec, model = _model(mode, *extra)
    model.train()
    if precision == "bf16":
        model.to(torch.bfloat16)
    x, y = _batch(cfg)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        measured, _ = _measure(model, spec.blocks(model), x, y)
    kept, _ = part_activations(cfg, spec, MICRO, 0, cfg.model.n_layer, True, True)
    assert measured == pytest.approx(kept, rel=TOLERANCE)
    dry_cfg = compose_config("gpt_tiny", _overrides(mode, extra[0], *extra[2:]), validate=False)
    dry = part_activations(dry_cfg, model_spec(dry_cfg), MICRO, 0, 2, True, True)[0]
    assert kept > dry * (1.05 if mode == "full" else 1.5)  # the masks are not small change


def test_checkpointing_drops_saved_bytes_as_estimated():
    got, want = {}, {}
    for mode in ("none", "selective", "full"):
        cfg, spec, model = _model(mode)
        got[mode], _ = _measure(model, spec.blocks(model), *_batch(cfg))
        want[mode] = part_activations(cfg, spec, MICRO, 0, cfg.model.n_layer, True, True)[0]
    for mode in ("selective", "full"):
        assert got[mode] / got["none"] == pytest.approx(want[mode] / want["none"], abs=0.02)
    assert got["full"] < got["selective"] < got["none"]


@pytest.mark.parametrize("mode", ["none", "full"])
def test_pipeline_stage_activations_match_the_estimate(mode):
    cfg, spec, _ = _model(mode, "pp=2")
    plan = build_plan(cfg, CPU)
    torch.manual_seed(0)
    full = spec.build("cpu")
    last = plan.pipeline.stages[-1]
    stage = spec.pipeline_stage(full, last)
    blocks = spec.blocks(stage)
    apply_activation_checkpointing(stage, blocks, mode, last.layers[0])
    h = torch.randn(MICRO, cfg.model.block_size, cfg.model.n_embd, requires_grad=True)
    with SavedTensorMeter(stage, blocks) as meter:
        cross_entropy(stage(h), _batch(cfg)[1])
    assert meter.bytes == pytest.approx(last.activation_bytes, rel=TOLERANCE)


def test_checkpointing_keeps_gradients_and_parameter_names():
    grads, names = {}, {}
    for mode in ("none", "selective", "full"):
        cfg, spec, model = _model(mode)
        _, loss = _measure(model, spec.blocks(model), *_batch(cfg))
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
        names[mode] = list(model.state_dict())
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    assert list(get_model_state_dict(model)) == names["none"]  # DCP keys: the plain ones
    for mode in ("selective", "full"):
        assert names[mode] == names["none"]
        for n, g in grads["none"].items():
            torch.testing.assert_close(grads[mode][n], g, rtol=0, atol=1e-7)


def test_batchnorm_in_a_checkpointed_block_counts_each_batch_once():
    batchnorm_counts_each_batch_once(compiled=False)  # compiled: tests/launch (g++ runs)


def batchnorm_counts_each_batch_once(compiled: bool) -> None:
    """The recomputation in backward is a second forward: a BatchNorm in a checkpointed
    block updated its running statistics twice a step (num_batches_tracked 12 after 6
    steps, the running variance that evaluation and an export use off: a new user's find).
    Statistics, gradients and the loss equal those of the plain model, step after step."""
    from torch import nn

    from dtrain_cli.runtime.parallel.activation_checkpoint import apply_activation_checkpointing

    def conv_net() -> nn.Module:
        torch.manual_seed(0)
        net = nn.Module()
        net.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
            for _ in range(3)
        )
        return net

    def run(net: nn.Module) -> list[torch.Tensor]:
        torch.manual_seed(1)
        for _ in range(3):
            h = torch.randn(8, 4, 6, 6, requires_grad=True)
            for block in net.blocks:
                h = block(h)
            h.square().mean().backward()
        return [t.detach().clone() for t in (*net.buffers(), *(p.grad for p in net.parameters()))]

    plain, checkpointed = conv_net(), conv_net()
    assert apply_activation_checkpointing(checkpointed, list(checkpointed.blocks), "full") == [
        0,
        1,
        2,
    ]
    if compiled:  # as train.compile=true does it (a review's find: step 1 failed)
        for block in checkpointed.blocks:
            block.compile()
    want, got = run(plain), run(checkpointed)
    assert int(checkpointed.blocks[0][1].num_batches_tracked) == 3
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


def test_a_model_without_blocks_cannot_checkpoint():
    from dtrain_cli.errors import ConfigError

    cfg = compose_config("cnn_bn", ["parallel.activation_checkpointing=full"], validate=False)
    with pytest.raises(ConfigError) as err:
        build_plan(cfg, CPU)
    assert any("has no repeated blocks to checkpoint; use none" in p for p in err.value.problems)


@pytest.mark.parametrize("attention", ["sdpa", "math"])
@pytest.mark.parametrize(
    ("strategy", "param_dtype"), [("ddp", torch.float32), ("fsdp", torch.bfloat16)]
)
def test_bf16_autocast_activations_match_the_estimate(strategy, param_dtype, attention):
    """precision=bf16 runs the model under autocast. Over DDP's (and ZeRO-1's) fp32 parameters
    the residual stream stays fp32 and q, k and v each save their own bf16 copy of the
    norm's output; FSDP2 computes with bf16 parameters (its MixedPrecisionPolicy), all of
    it in bf16. Counted as dtrain simulate counts (the weights' bf16 copies are weights)."""
    from dtrain_cli.runtime.simulate_measure import SavedBytesMeter

    extra = ("precision=bf16", f"parallel.strategy={strategy}", f"model.attention={attention}")
    cfg, spec, model = _model("none", *extra)
    model.to(param_dtype)
    x, y = _batch(cfg)
    with SavedBytesMeter() as meter, torch.autocast("cpu", dtype=torch.bfloat16):
        cross_entropy(model(x), y).backward()
    kept, _ = part_activations(cfg, spec, MICRO, 0, cfg.model.n_layer, True, True)
    assert meter.peak_step_bytes == pytest.approx(kept, rel=TOLERANCE)  # 25 % apart
    if strategy == "ddp":  # ZeRO-1 shards the optimizer only: the same fp32 parameters
        zero1 = compose_config("gpt_tiny", _overrides("none", "precision=bf16",
                               "parallel.strategy=zero1"), validate=False)  # fmt: skip
        assert part_activations(zero1, spec, MICRO, 0, cfg.model.n_layer, True, True)[0] == kept


def test_math_attention_computes_what_sdpa_computes():
    """model.attention=math is the same causal attention written out: one seed, one batch,
    the loss and every gradient equal SDPA's to float rounding (and the parameters are the
    same tensors, so checkpoints move between the two)."""
    out = {}
    for attention in ("sdpa", "math"):
        cfg, _, model = _model("none", f"model.attention={attention}")
        loss = cross_entropy(model(_batch(cfg)[0]), _batch(cfg)[1])
        loss.backward()
        out[attention] = (loss.item(), {n: p.grad for n, p in model.named_parameters()})
    (loss_a, grads_a), (loss_b, grads_b) = out["sdpa"], out["math"]
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-6, msg=name)
