"""Synchronized BatchNorm on CPU/gloo equals plain BatchNorm on the concatenated batch."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from dtrain_cli.runtime.parallel.sync_batchnorm import CPUSyncBatchNorm, apply_sync_batchnorm
from tests.conftest import REPO

WORLD = 2


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, 5, 5, generator=g) * 3 + 1
    r = torch.randn(8, 4, 5, 5, generator=g)  # loss = sum(y * r): a non-trivial dy
    return x, r


def _reference() -> dict[str, torch.Tensor]:
    x, r = _batch()
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
        bn.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
    x = x.clone().requires_grad_(True)
    y = bn(x)
    (y * r).sum().backward()
    return {
        "y": y.detach(),
        "dx": x.grad,
        "dw": bn.weight.grad,
        "db": bn.bias.grad,
        "rm": bn.running_mean,
        "rv": bn.running_var,
        "w": bn.weight.detach(),
        "b": bn.bias.detach(),
    }


def _worker(rank: int, port: int, queue: mp.SimpleQueue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    ref = _reference()
    model = nn.Sequential(nn.BatchNorm2d(4))
    with torch.no_grad():
        model[0].weight.copy_(ref["w"])
        model[0].bias.copy_(ref["b"])
    model = apply_sync_batchnorm(model, dist.group.WORLD, torch.device("cpu"))
    assert isinstance(model[0], CPUSyncBatchNorm)
    x, r = _batch()
    half = slice(rank * 4, rank * 4 + 4)
    xs = x[half].clone().requires_grad_(True)
    y = model(xs)
    (y * r[half]).sum().backward()
    dw, db = model[0].weight.grad.clone(), model[0].bias.grad.clone()
    dist.all_reduce(dw)  # the loss is a sum over ranks: parameter gradients add up
    dist.all_reduce(db)
    pairs = [
        (y.detach(), ref["y"][half]),
        (xs.grad, ref["dx"][half]),
        (dw, ref["dw"]),
        (db, ref["db"]),
        (model[0].running_mean, ref["rm"]),
        (model[0].running_var, ref["rv"]),
    ]
    # relative to each tensor's scale (weight gradients are sums over 100 elements)
    err = max(((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item() for a, b in pairs)
    model.eval()  # eval uses the (synchronized) running statistics, no collective
    y_eval = model(xs)
    queue.put((rank, err, y_eval.shape == xs.shape))
    dist.destroy_process_group()


def test_sync_batchnorm_equals_global_batchnorm():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(port, queue), nprocs=WORLD, start_method="spawn")
    results = sorted(queue.get() for _ in range(WORLD))
    for rank, err, ok in results:
        assert err <= 1e-6, f"rank {rank}: max difference {err}"
        assert ok


@pytest.mark.multiproc
def test_cnn_bn_recipe_trains_with_sync_bn(tmp_path):
    from tests.conftest import run_dtrain

    run = run_dtrain(
        [
            "launch",
            "recipe=cnn_bn",
            "dp=2",
            "parallel.sync_batchnorm=true",
            "train.steps=30",
            "logging.every=10",
            "logging.tensorboard=false",
            "debug.replica_check_at_end=true",
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [r["loss"] for r in run.metrics()]
    assert losses[-1] < losses[0]
    assert run.summary()["replicas_identical"] is True
    # an image model's throughput is in samples, not tokens (console, metrics, summary)
    assert all("samples_per_s" in r and "tokens_per_s" not in r for r in run.metrics())
    assert run.summary()["samples_per_s"] > 0 and "tokens_per_s" not in run.summary()
    assert "samples/s" in run.stdout and "tok/s" not in run.stdout


# -- any model: parallel.sync_batchnorm=true at dp=2 (8 samples a rank) equals dp=1 (16) --
BN_ENV = {
    "PYTHONPATH": os.pathsep.join(
        [str(REPO / "tests"), str(REPO / "examples")]  # bn_targets, my_models
    )
}
FOUR_STEPS = [
    "train.steps=4",
    "train.global_batch_size=16",
    "logging.every=1",
    "train.eval_every=0",
    "logging.tensorboard=false",
    "optim.warmup_steps=0",
]
BN_MODELS = {
    "own_bn_mlp": [
        "model=custom",
        "model._target_=bn_targets.BNNet",
        "data=custom",
        "data._target_=my_models.net.Pairs",
        "train.loss=mse",
    ],
    "hf_resnet": [
        "model=custom",
        "model._target_=transformers.ResNetForImageClassification",
        "model.config={_target_:transformers.ResNetConfig,num_channels:3,embedding_size:8,"
        "hidden_sizes:[8,16],depths:[1,1],layer_type:basic,num_labels:3}",
        "data=custom",
        "data._target_=bn_targets.Images",
        "train.loss=cross_entropy",
    ],
}


def _bn_launch(tmp_path_factory: pytest.TempPathFactory, model: str, *layout: str):
    from tests.conftest import run_dtrain

    cwd = tmp_path_factory.mktemp(f"{model}-{'-'.join(layout)}")
    run = run_dtrain(["launch", *BN_MODELS[model], *FOUR_STEPS, *layout], cwd, env=BN_ENV)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run


@pytest.mark.multiproc
@pytest.mark.parametrize("model", list(BN_MODELS))
def test_sync_batchnorm_at_dp2_equals_dp1_for_any_model(tmp_path_factory, model):
    ref = _bn_launch(tmp_path_factory, model, "dp=1", "train.micro_batch_size=16")
    run = _bn_launch(
        tmp_path_factory, model, "dp=2", "train.micro_batch_size=8", "parallel.sync_batchnorm=true"
    )
    ref_losses = [r["loss"] for r in ref.metrics()]
    assert len(ref_losses) == 4
    assert [r["loss"] for r in run.metrics()] == pytest.approx(ref_losses, rel=1e-4, abs=1e-6)
    assert run.summary()["param_sum"] == pytest.approx(ref.summary()["param_sum"], rel=1e-4)
    assert "BatchNorm" not in run.stdout + run.stderr  # synchronized: no warning


@pytest.mark.multiproc
def test_batchnorm_at_dp2_without_sync_differs_and_is_warned(tmp_path_factory):
    """The same model unsynchronized normalizes over 8 samples a rank: the launch warns,
    and the curve is not the dp=1 one (what the synchronized run above fixes)."""
    ref = _bn_launch(tmp_path_factory, "own_bn_mlp", "dp=1", "train.micro_batch_size=16")
    run = _bn_launch(tmp_path_factory, "own_bn_mlp", "dp=2", "train.micro_batch_size=8")
    assert "2 BatchNorm layers and dp=2" in run.stdout + run.stderr
    assert "parallel.sync_batchnorm=true" in run.stdout + run.stderr
    ref_losses = [r["loss"] for r in ref.metrics()]
    gap = max(abs(a["loss"] - b) for a, b in zip(run.metrics(), ref_losses, strict=True))
    assert gap > 1e-3
