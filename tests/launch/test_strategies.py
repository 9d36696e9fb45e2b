"""Memory and communication strategies train the same model: ZeRO-1, FSDP2 (and with TP),
gradient compression, local SGD; plus the measured memory they save."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dtrain_cli.checkpoint import catalog
from tests.conftest import Run, run_dtrain

pytestmark = pytest.mark.multiproc

# SGD (constant LR) keeps rounding noise from being amplified, so layouts compare at 1e-5.
BASE = [
    "recipe=gpt_tiny",
    "optim=sgd",
    "optim.warmup_steps=0",
    "train.steps=10",
    "train.global_batch_size=8",
    "logging.every=1",
    "train.eval_every=0",
    "logging.tensorboard=false",
    "debug.replica_check_at_end=true",  # replicas_identical
]


def launch(cwd: Path, *args: str) -> Run:
    run = run_dtrain(["launch", *BASE, *args], cwd, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def final_params(run: Run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from dtrain_cli.checkpoint.export import export_model

    out = run.run_dir / "final.safetensors"
    export_model(catalog.newest_complete(run.run_dir), out)
    return load_file(str(out))


def losses(run: Run) -> list[float]:
    return [r["loss"] for r in run.metrics()]


def assert_same_training(run: Run, ref: Run) -> None:
    assert losses(run) == pytest.approx(losses(ref), rel=1e-5)
    got, want = final_params(run), final_params(ref)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)


RUNS = {
    "single": ["dp=1"],
    "ddp2": ["dp=2"],
    "zero1-2": ["dp=2", "parallel.strategy=zero1"],
    "zero1-4": ["dp=4", "parallel.strategy=zero1"],
    "fsdp2": ["dp=2", "parallel.strategy=fsdp"],
    "fsdp4": ["dp=4", "parallel.strategy=fsdp"],
    "fsdp2-zero2": ["dp=2", "parallel.strategy=fsdp", "parallel.reshard_after_forward=false"],
    "fsdp2-tp2": ["dp=2", "tp=2", "parallel.strategy=fsdp"],
    "hsdp2x2": ["dp=4", "parallel.strategy=hsdp", "parallel.dp_shard=2"],  # 2 groups of 2
    "localsgd1": ["dp=2", "sync.mode=local_sgd", "sync.every=1"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    return {name: launch(tmp_path_factory.mktemp(name), *args) for name, args in RUNS.items()}


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("zero1-2", "ddp2"),
        ("zero1-4", "single"),  # dp=4 against one process (ddp2 == single is checked too)
        ("fsdp2", "ddp2"),
        ("fsdp4", "single"),
        ("fsdp2-zero2", "ddp2"),
        ("fsdp2-tp2", "single"),
        ("hsdp2x2", "single"),  # FSDP2 on the 2-D (replicate, shard) mesh
        ("ddp2", "single"),
        ("localsgd1", "ddp2"),
    ],
)
def test_strategy_trains_the_same_model(name, ref, runs):
    assert_same_training(runs[name], runs[ref])


@pytest.mark.parametrize("name", list(RUNS))
def test_no_python_warning_reaches_the_console(name, runs):
    """torch's own warnings about dtrain's code are for dtrain to fix, not for users to read
    (hsdp printed "Slicing a flattened dim from root mesh will be deprecated")."""
    out = runs[name].stdout + runs[name].stderr
    assert "UserWarning" not in out and "FutureWarning" not in out, out[-2000:]


@pytest.mark.parametrize(("name", "dp"), [("fsdp2", 2), ("fsdp4", 4), ("hsdp2x2", 2)])
def test_fsdp_parameters_are_a_dp_th_of_full(name, dp, runs):
    """fsdp over dp ranks; hsdp over its shard group (dp_shard=2 of dp=4)."""
    full = runs["ddp2"].summary()["memory_params_bytes"]["measured"]  # the whole model
    assert runs[name].summary()["memory_params_bytes"]["measured"] <= 1.05 * full / dp


def adamw_args(dp: int) -> list[str]:
    return [
        "recipe=gpt_tiny",
        f"dp={dp}",
        "train.steps=2",
        "train.global_batch_size=8",
        "optim.warmup_steps=0",
        "logging.tensorboard=false",
        "checkpoint.at_end=false",
    ]


@pytest.fixture(scope="module")
def adamw_ddp(tmp_path_factory) -> dict[int, Run]:
    """The unsharded AdamW run per dp, launched on first use (zero1 and fsdp at dp=2 share it)."""

    class ByDp(dict):
        def __missing__(self, dp: int) -> Run:
            cwd = tmp_path_factory.mktemp(f"adamw-ddp{dp}")
            run = run_dtrain(["launch", *adamw_args(dp)], cwd)
            assert run.returncode == 0, run.stderr[-2000:]
            self[dp] = run
            return run

    return ByDp()


@pytest.mark.parametrize(("strategy", "dp"), [("zero1", 2), ("fsdp", 2), ("zero1", 4)])
def test_adamw_state_is_sharded(strategy, dp, tmp_path, adamw_ddp):
    full = adamw_ddp[dp]
    shard = run_dtrain(["launch", *adamw_args(dp), f"parallel.strategy={strategy}"], tmp_path)
    assert shard.returncode == 0, shard.stderr[-2000:]
    f = full.summary()["memory_optimizer_bytes"]["measured"]
    s = shard.summary()["memory_optimizer_bytes"]
    assert s["measured"] <= 1.05 * f / dp
    assert s["estimate"] == pytest.approx(f / dp, rel=0.05)


@pytest.fixture(scope="module")
def compressed(tmp_path_factory) -> dict[str, Run]:
    long = ["train.steps=50", "dp=2", "logging.every=10", "optim=adamw", "optim.base_lr=1e-3"]
    out = {}
    for name, extra in {
        "none": [],
        "fp16": ["comm.compression=fp16"],
        "bf16": ["comm.compression=bf16"],
        "powersgd": [
            "comm.compression=powersgd",
            "comm.powersgd_rank=4",
            "comm.powersgd_start_iter=5",
        ],
    }.items():
        out[name] = launch(tmp_path_factory.mktemp(name), *long, *extra)
    return out


@pytest.mark.parametrize(
    ("name", "tolerance"), [("fp16", 0.002), ("bf16", 0.01), ("powersgd", 0.05)]
)
def test_compression_keeps_replicas_identical_and_loss_close(name, tolerance, compressed):
    run, ref = compressed[name].summary(), compressed["none"].summary()
    assert run["replicas_identical"] is True
    rel = abs(run["final_loss"] - ref["final_loss"]) / ref["final_loss"]
    assert rel <= tolerance, (
        f"{name}: loss after 50 steps {run['final_loss']} vs {ref['final_loss']}"
    )
    assert run["comm_bytes_per_step_estimate"] < ref["comm_bytes_per_step_estimate"]
    train = compressed[name].metrics()
    assert all(r["comm_ms"] >= 0 and "comm_exposed_ms" in r for r in train)


def test_local_sgd_every_8_averages_and_logs_divergence(tmp_path):
    run = launch(
        tmp_path,
        "dp=2",
        "train.steps=17",
        "sync.mode=local_sgd",
        "sync.every=8",
        "optim.base_lr=0.5",
    )
    sync = run.metrics("sync")
    assert [r["step"] for r in sync] == [1, 9, 17]
    assert all(r["identical_after"] == 1.0 for r in sync)
    assert sync[1]["divergence"] > 0  # 8 local steps apart from each other
    assert run.summary()["replicas_identical"] is True  # averaged before the final save


def test_fsdp_does_not_report_a_false_replica_alarm(tmp_path):
    """FSDP ranks hold different shards by design: the replica check does not apply (it
    hashed each rank's shard and always said False), and the console raises no alarm."""
    run = launch(tmp_path, "dp=2", "parallel.strategy=fsdp", "train.steps=3", "model.n_layer=1")
    s = run.summary()
    assert s["replicas_identical"] is None and "fsdp shards the parameters" in s["replicas_check"]
    assert "replicas" not in run.stdout[run.stdout.index("run summary") :]
