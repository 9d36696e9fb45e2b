"""Plan math: batch and accumulation, LR scaling and schedule, mesh, estimates."""

from __future__ import annotations

import math

import pytest

from dtrain_cli.config.compose import compose_config
from dtrain_cli.models import model_spec
from dtrain_cli.plan.build import Resources, build_plan
from dtrain_cli.plan.plan import LRPlan, Plan

CPU = Resources(num_gpus=0, num_cpus=2)
ZBV = ["pp=2", "pipeline.schedule=zbv", "pipeline.virtual_stages=2"]


def plan_for(*overrides: str, resources: Resources = CPU) -> Plan:
    return build_plan(compose_config("gpt_tiny", list(overrides)), resources)


@pytest.mark.parametrize(
    ("dp", "micro", "global_batch", "accum"),
    [(1, 8, 16, 2), (2, 8, 16, 1), (2, 2, 16, 4), (4, 1, 32, 8)],
)
def test_global_batch_sets_accumulation(dp, micro, global_batch, accum):
    p = plan_for(
        f"dp={dp}", f"train.micro_batch_size={micro}", f"train.global_batch_size={global_batch}"
    )
    assert p.batch.grad_accum == accum
    assert p.batch.micro_batch_size * p.batch.grad_accum * p.batch.dp == global_batch
    assert p.batch.tokens_per_step == global_batch * 128


def test_grad_accum_sets_global_batch():
    p = plan_for(
        "dp=2", "train.micro_batch_size=4", "~train.global_batch_size", "train.grad_accum=3"
    )
    assert p.batch.global_batch_size == 24 and p.batch.grad_accum == 3


@pytest.mark.parametrize(("rule", "factor"), [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_lr_scaling_rules(rule, factor):
    p = plan_for(
        "dp=4",
        "train.micro_batch_size=16",
        "train.global_batch_size=64",
        "optim.base_batch_size=16",
        "optim.base_lr=1e-3",
        f"lr_scaling={rule}",
    )
    assert p.lr.peak_lr == pytest.approx(1e-3 * factor)


def test_warmup_then_cosine_to_min_lr():
    lr = LRPlan(
        base_lr=1.0,
        base_batch_size=1,
        scaling="none",
        peak_lr=1.0,
        warmup_steps=10,
        decay="cosine",
        min_lr=0.1,
        steps=110,
    )
    assert lr.lr_at(0) == pytest.approx(0.1)
    assert lr.lr_at(4) == pytest.approx(0.5)
    assert lr.lr_at(9) == pytest.approx(1.0)
    assert lr.lr_at(10) == pytest.approx(1.0)
    assert lr.lr_at(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr.lr_at(110) == pytest.approx(0.1)
    assert all(lr.lr_at(s) >= lr.lr_at(s + 1) - 1e-12 for s in range(10, 110))


def test_linear_and_constant_decay():
    kw = dict(
        base_lr=1.0,
        base_batch_size=1,
        scaling="none",
        peak_lr=2.0,
        warmup_steps=0,
        min_lr=0.0,
        steps=100,
    )
    assert LRPlan(decay="linear", **kw).lr_at(50) == pytest.approx(1.0)
    assert LRPlan(decay="constant", **kw).lr_at(99) == pytest.approx(2.0)


def test_mesh_coordinates_tp_innermost():
    p = plan_for("dp=2")
    assert p.mesh.dim_names == ["pp", "dp", "tp"] and p.mesh.shape == [1, 2, 1]
    assert p.rank_table() == [
        {"rank": 0, "pp": 0, "dp": 0, "tp": 0},
        {"rank": 1, "pp": 0, "dp": 1, "tp": 0},
    ]
    from dtrain_cli.plan.plan import MeshPlan

    m = MeshPlan(dim_names=["pp", "dp", "tp"], shape=[2, 2, 2])
    assert [m.coords(r)["tp"] for r in range(8)] == [0, 1] * 4
    assert [m.coords(r)["pp"] for r in range(8)] == [0] * 4 + [1] * 4


def test_world_size_and_device():
    p = plan_for("dp=2")
    assert (p.world_size, p.nproc_per_node, p.device, p.backend) == (2, 2, "cpu", "gloo")
    g = plan_for(
        "dp=4",
        "precision=bf16",
        "train.global_batch_size=32",
        resources=Resources(num_gpus=8, num_cpus=32),
    )
    assert (g.device, g.backend, g.precision.autocast_dtype) == ("cuda", "nccl", "bfloat16")
    assert g.threads_per_proc == 8


def test_checkpoint_cadence_in_plan():
    p = plan_for("train.steps=100", "checkpoint.every_steps=30")
    assert p.checkpoint.steps == [30, 60, 90, 100]


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("gpt_tiny", []), ("gpt_small", []), ("gpt_tiny", ["model.tie_embeddings=true"])],
)
def test_param_count_matches_the_model(name, overrides):
    """The plan's torch-free count is the parameter count of the module the runtime builds."""
    spec = model_spec(compose_config(name, overrides))
    model = spec.build("meta")
    assert spec.facts().num_params == sum(p.numel() for p in model.parameters())


def test_estimates_scale_with_optimizer():
    adam = plan_for("optim=adamw").estimates
    sgd = plan_for("optim=sgd").estimates
    assert adam.bytes_optimizer == 2 * adam.bytes_params and sgd.bytes_optimizer == 0
    assert adam.flops_per_token > 6 * adam.num_params * 0.5


def test_plan_yaml_round_trip(tmp_path):
    p = plan_for("dp=2", "precision=bf16")
    p.save(tmp_path / "plan.yaml")
    q = Plan.load(tmp_path / "plan.yaml")
    assert q == p
    assert math.isclose(q.lr.lr_at(3), p.lr.lr_at(3))


def test_pipeline_plan_stages_bubble_and_warning():
    p = plan_for("pp=2", "train.global_batch_size=8", "train.micro_batch_size=4")
    pipe = p.pipeline
    assert pipe.microbatches == 2 and pipe.calls_per_step == 1
    assert pipe.bubble == pytest.approx(1 / 3)  # (p-1)/(m+p-1)
    assert [s.layers for s in pipe.stages] == [[0, 2], [2, 4]]
    assert pipe.stages[0].embeddings and pipe.stages[1].head
    assert sum(s.params for s in pipe.stages) == p.estimates.num_params
    assert any("bubble 33%" in w and "use >= 3" in w for w in p.warnings)
    ok = plan_for("pp=2", "train.global_batch_size=8", "train.micro_batch_size=1")
    assert ok.pipeline.bubble == pytest.approx(1 / 9) and not ok.warnings


@pytest.mark.parametrize(
    ("tp", "dp", "nproc", "spans"), [(4, 1, 2, True), (2, 3, 3, True), (2, 2, 2, False)]
)
def test_tensor_parallel_across_nodes_is_warned(tp, dp, nproc, spans):
    """tp ranks are consecutive (tp innermost): they stay on one node iff tp divides the
    processes per node; otherwise every layer's all-reduces cross the network."""
    world = tp * dp
    p = plan_for(
        f"tp={tp}",
        f"dp={dp}",
        f"parallel.nnodes={world // nproc}",
        f"parallel.nproc_per_node={nproc}",
        "train.global_batch_size=12",
        "model.n_head=4",
    )
    warned = [w for w in p.warnings if "spans nodes" in w]
    assert bool(warned) == spans
    if spans:
        assert warned[0].startswith(f"tp={tp} spans nodes ({nproc} processes per node)")
        assert f"(tp={max(d for d in (1, 2, 4) if nproc % d == 0 and d <= tp)}," in warned[0]
    assert not [
        w
        for w in plan_for(f"tp={tp}", f"dp={dp}", "train.global_batch_size=12").warnings
        if "spans nodes" in w
    ]


def test_powersgd_that_would_never_compress_is_warned():
    """torch's hook all-reduces exactly for powersgd_start_iter steps (at least 2): a run no
    longer than that never compresses, and equalled the plain run bitwise, silently."""
    said = "comm.compression=powersgd: its first 10 steps are exact all-reduces"
    short = plan_for("dp=2", "comm.compression=powersgd", "train.steps=8")
    assert any(w.startswith(said) and "train.steps=8: it never compresses" in w
               for w in short.warnings)  # fmt: skip
    longer = plan_for("dp=2", "comm.compression=powersgd", "train.steps=11")
    assert not any("never compresses" in w for w in longer.warnings)


def test_interleaved_and_v_schedules_place_stages():
    loop = plan_for("pp=2", "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2")
    assert [s.pp_rank for s in loop.pipeline.stages] == [0, 1, 0, 1]
    v = plan_for("pp=2", "pipeline.schedule=zbv", "pipeline.virtual_stages=2")
    assert [s.pp_rank for s in v.pipeline.stages] == [0, 1, 1, 0]
    assert v.pipeline.bubble == pytest.approx(1 / (2 * v.pipeline.microbatches + 1))


def test_default_micro_batch_fits_the_headline_command():
    from dtrain_cli.config.compose import compose_config

    p = build_plan(compose_config("gpt_small", ["dp=4", "pp=2"]), CPU)
    assert p.world_size == 8 and p.batch.global_batch_size == 32
    assert p.pipeline.microbatches >= 2
    # the exact command: 8 micro-batches of the 8 samples each dp rank runs
    q = build_plan(
        compose_config(
            "gpt_small", ["dp=4", "pp=2", "pipeline.schedule=1f1b", "pipeline.microbatches=8"]
        ),
        CPU,
    )
    assert q.pipeline.microbatches == 8 and q.batch.micro_batch_size == 1


def test_custom_layer_split():
    p = plan_for("pp=2", "pipeline.layers_per_stage=[1,3]")
    assert [s.layers for s in p.pipeline.stages] == [[0, 1], [1, 4]]


@pytest.mark.parametrize(
    ("schedule", "per_rank"),
    [("zbv", 2), ("dualpipev", 2), ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 1)],
)
def test_virtual_stages_unset_are_the_schedule_s(schedule, per_rank):
    """pp=2 pipeline.schedule=zbv alone was refused for a value the user never set
    (pipeline.virtual_stages=1: schedule zbv needs exactly 2)."""
    p = plan_for("pp=2", f"pipeline.schedule={schedule}")
    assert p.pipeline.virtual_stages == per_rank
    assert p.pipeline.num_stages == 2 * per_rank


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["pp=2", "pipeline.schedule=zerobubble"], "choose one of gpipe, 1f1b, interleaved_1f1b"),
        (["pp=8"], "model.n_layer=4: not divisible by pp=8"),
        (["tp=8"], "model.n_head=4: not divisible by tp=8"),
        (
            ["pp=2", "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=3"],
            "not divisible by pp*virtual_stages=6",
        ),
        (
            ["pp=2", "pipeline.schedule=zbv", "pipeline.virtual_stages=1"],
            "pipeline.virtual_stages=1: schedule zbv needs exactly 2",
        ),
        (
            ["pp=2", "pipeline.schedule=gpipe", "pipeline.virtual_stages=2"],
            "pipeline.virtual_stages=2: schedule gpipe runs one stage per rank",
        ),
        (
            ["pp=4", "train.global_batch_size=8", "train.micro_batch_size=4"],
            "pipeline.microbatches=2: schedule 1f1b needs >= 4",
        ),
        (["pp=2", "pipeline.layers_per_stage=[1,2]"], "summing to model.n_layer=4"),
        (["pp=2", "pipeline.microbatches=3"], "must divide"),
    ],
)
def test_model_parallel_bad_input(overrides, expected):
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        build_plan(compose_config("gpt_tiny", overrides, validate=False), CPU)
    assert expected in "\n".join(info.value.problems)


def test_a_pipeline_microbatch_count_that_does_not_divide_is_the_one_error():
    """It came with a second error on train.global_batch_size, about the micro-batch of 10
    (32 // 3) the user never set; the choices stopped at 16 of 32."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.errors import ConfigError

    overrides = ["pp=2", "pipeline.microbatches=3", "train.global_batch_size=32"]
    with pytest.raises(ConfigError) as info:
        build_plan(compose_config("gpt_tiny", overrides, validate=False), CPU)
    assert info.value.problems == [
        "pipeline.microbatches=3: must divide the 32 samples each dp rank runs per step "
        "(global_batch_size/dp); use one of [2, 4, 8, 16, 32]"
    ]  # not 1: schedule 1f1b needs >= pp=2 (it was offered, then refused: a new user's find)


def test_strategy_estimates_and_comm_bytes():
    ddp = plan_for("dp=4", "train.global_batch_size=32").estimates
    zero = plan_for("dp=4", "train.global_batch_size=32", "parallel.strategy=zero1").estimates
    fsdp = plan_for("dp=4", "train.global_batch_size=32", "parallel.strategy=fsdp").estimates
    assert ddp.bytes_optimizer / 4 <= zero.bytes_optimizer < ddp.bytes_optimizer / 2
    assert fsdp.bytes_optimizer == pytest.approx(ddp.bytes_optimizer / 4, rel=1e-6)
    assert fsdp.bytes_grads == pytest.approx(ddp.bytes_grads / 4, rel=1e-6)
    assert fsdp.bytes_params < ddp.bytes_params / 2
    n = ddp.num_params
    assert ddp.grad_payload_bytes == 4 * n and ddp.comm_bytes_per_step == int(2 * 0.75 * 4 * n)
    fp16 = plan_for("dp=4", "train.global_batch_size=32", "comm.compression=fp16").estimates
    assert fp16.grad_payload_bytes == 2 * n
    psgd = plan_for(
        "dp=4", "train.global_batch_size=32", "comm.compression=powersgd", "comm.powersgd_rank=1"
    ).estimates
    assert psgd.grad_payload_bytes < fp16.grad_payload_bytes / 10


@pytest.mark.parametrize(("recipe", "dp"), [("gpt_tiny", 4), ("gpt_tiny", 64), ("cnn_bn", 8)])
def test_zero1_optimizer_estimate_is_torchs_fullest_partition(recipe, dp):
    """ZeroRedundancyOptimizer's own partition of the model the runtime builds (its rank 0
    computes every rank's, on torch's fake process group): the plan's optimizer state is
    the optimizer's words for the rank that got the most (whole tensors, not an even share)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dtrain_cli.runtime.state.optim import build_optimizer

    batch = f"train.global_batch_size={4 * dp}"
    cfg = compose_config(recipe, [f"dp={dp}", "parallel.strategy=zero1", batch])
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp)
    try:
        model = model_spec(cfg).build("cpu")
        zero = build_optimizer(model, cfg.optim, 1e-3, zero_group=dist.group.WORLD)
        parts = zero._partition_parameters()
    finally:
        dist.destroy_process_group()
    held = [sum(p.numel() for group in part for p in group["params"]) for part in parts]
    assert len(held) == dp and sum(held) == sum(p.numel() for p in model.parameters())
    words = 2 if cfg.optim.name == "adamw" else 1  # cnn_bn: SGD with momentum
    assert build_plan(cfg, CPU).estimates.bytes_optimizer == words * 4 * max(held)


def test_cnn_param_count_matches_the_model():
    spec = model_spec(compose_config("cnn_bn", []))
    model = spec.build("cpu")
    assert spec.facts().num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("recipe", "overrides", "expected"),
    [
        ("gpt_tiny", ["parallel.strategy=zero2"], "choose one of ddp, zero1, fsdp"),
        ("gpt_tiny", ["parallel.cpu_offload=true"], "an fsdp option, but parallel.strategy=ddp"),
        (
            "gpt_tiny",
            ["dp=2", "parallel.strategy=fsdp", "comm.compression=fp16"],
            "DDP communication hooks apply",
        ),
        ("gpt_tiny", ["comm.powersgd_rank=0"], "comm.powersgd_rank=0: must be >= 1"),
        ("gpt_tiny", ["pp=2", "sync.mode=local_sgd"], "sync.mode=local_sgd: needs strategy=ddp"),
        ("gpt_tiny", ["tp=2", "parallel.strategy=zero1"], "use parallel.strategy=fsdp with tp"),
        (
            "gpt_tiny",
            [*ZBV, "dp=2", "parallel.strategy=zero1"],
            "parallel.strategy=zero1: pipeline.schedule=zbv computes weight gradients outside",
        ),
        (
            "gpt_tiny",
            [*ZBV, "dp=2", "comm.compression=fp16"],
            "tp=1, pipeline.schedule=zbv",
        ),
        ("gpt_tiny", ["data=shapes"], "images need an image model"),
        ("cnn_bn", ["tp=2"], "model.kind=cnn_bn: data parallel only"),
    ],
)
def test_strategy_bad_input(recipe, overrides, expected):
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        build_plan(compose_config(recipe, overrides, validate=False), CPU)
    assert expected in "\n".join(info.value.problems)


def test_a_key_of_another_model_kind_is_named_with_the_keys_it_has():
    """channels belongs to the cnn_bn kind: on a GPT it is refused, naming the GPT's keys."""
    from dtrain_cli.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        plan_for("model.channels=[8]")
    (line,) = info.value.problems
    assert line.startswith("model.channels: not a key of model=gpt_tiny (kind gpt)")
    assert "n_layer" in line


@pytest.mark.parametrize("recipe", ["cnn_bn", "gpt_tiny"])
def test_model_sync_bn_moved_to_parallel_sync_batchnorm(recipe):
    """The old cnn_bn key is one line naming the key that works for every model."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_config(recipe, ["model.sync_bn=true"])
    (line,) = info.value.problems
    assert line.startswith("model.sync_bn: moved: parallel.sync_batchnorm=true")


def test_batchnorm_at_dp_above_one_warns_unless_synchronized():
    cnn = compose_config("cnn_bn", ["dp=2"], validate=False)
    (warning,) = [w for w in build_plan(cnn, CPU).warnings if "BatchNorm" in w]
    assert "2 BatchNorm layers and dp=2" in warning
    assert "its own 16 samples" in warning and "parallel.sync_batchnorm=true" in warning
    synced = compose_config("cnn_bn", ["dp=2", "parallel.sync_batchnorm=true"], validate=False)
    assert not [w for w in build_plan(synced, CPU).warnings if "BatchNorm" in w]
    single = compose_config("cnn_bn", ["dp=1"], validate=False)
    assert not [w for w in build_plan(single, CPU).warnings if "BatchNorm" in w]
    gpt = compose_config("gpt_tiny", ["dp=2", "parallel.sync_batchnorm=true"], validate=False)
    assert "no BatchNorm layer to synchronize" in " ".join(build_plan(gpt, CPU).warnings)
    # accumulation: each micro-batch its own statistics, synchronized or not (a new user's
    # find: 4e-3 off dp=1's curve at step 4 without a word)
    synced_acc = ["dp=2", "parallel.sync_batchnorm=true", "train.micro_batch_size=8"]
    for over, samples in ((["train.micro_batch_size=8"], 8), (synced_acc, 16)):
        cfg = compose_config("cnn_bn", over, validate=False)
        (warning,) = [w for w in build_plan(cfg, CPU).warnings if "BatchNorm" in w]
        assert f"micro-batches a step: each normalizes over its own {samples} samples" in warning


def test_an_image_models_plan_counts_samples_not_tokens():
    from rich.console import Console

    from dtrain_cli.plan.render import render_plan

    p = build_plan(compose_config("cnn_bn", [], validate=False), CPU)
    assert p.batch.unit == "samples" and p.batch.seq_len == 1
    console = Console(record=True, width=120)
    console.print(render_plan(p))
    text = console.export_text()
    assert "32 samples" in text and "tokens" not in text and "FLOPs per sample" in text


def test_fsdp_under_a_zero_bubble_schedule_keeps_parameters_gathered():
    """The weight pass of zbv reads the stage's gathered parameters: no reshard after
    forward (said once as a warning), one all-gather per step in the estimate."""
    zbv = plan_for(*ZBV, "dp=2", "parallel.strategy=fsdp")
    assert any("parallel.reshard_after_forward=true: not under" in w for w in zbv.warnings)
    zero2 = plan_for(*ZBV, "dp=2", "parallel.strategy=fsdp", "parallel.reshard_after_forward=false")
    assert not any("reshard_after_forward" in w for w in zero2.warnings)
    assert zbv.estimates.comm_bytes_per_step == zero2.estimates.comm_bytes_per_step
    gpipe = plan_for("pp=2", "dp=2", "parallel.strategy=fsdp", "pipeline.schedule=gpipe")
    assert gpipe.estimates.comm_bytes_per_step > zero2.estimates.comm_bytes_per_step


def test_gpt_facts_follow_the_config_they_are_asked_for():
    """The built-in GPT's counts are kept per shape (dtrain advise asks for them once per
    layout): a config changed in place, or another of the same shape, gets its own."""
    cfg = compose_config("gpt_small", [])
    spec = model_spec(cfg)
    before = spec.facts()
    cfg.model.n_layer += 2
    after = spec.facts()
    assert after.num_params == before.num_params + 2 * before.params_per_layer
    assert after.num_layers == before.num_layers + 2
    assert sum(n for _, n, _ in after.param_rows) == after.num_params  # every tensor's rows
    cfg.model.name = "renamed"  # not a shape: the same counts
    assert model_spec(cfg).facts() == after


def test_the_plan_table_shows_the_dp_bytes_compression_changes():
    """docs/parallelism.md: "The plan shows the gradient bytes each option moves per step";
    only --format yaml had them."""
    from rich.console import Console

    from dtrain_cli.plan.render import render_plan

    def shown(*overrides: str) -> str | None:
        console = Console(width=200, record=True)
        console.print(render_plan(plan_for(*overrides)))
        lines = [x for x in console.export_text().splitlines() if "dp bytes sent" in x]
        return lines[0].split("│")[2].strip() if lines else None

    assert shown("dp=2") == "3.3 MiB" and shown("dp=2", "comm.compression=fp16") == "1.7 MiB"
    assert shown() is None  # dp=1 sends nothing
