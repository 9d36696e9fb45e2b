"""A layout whose estimated peak memory is above its device's is named in the plan's
warnings with what dominates it and a setting that fits: `dtrain plan recipe=gpt_1b
parallel.strategy=fsdp dp=8` printed "peak memory 1942.10 of 78.00 GiB" and nothing else."""

from __future__ import annotations

from dataclasses import replace

from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.cli.common import compose_and_plan
from dtrain_cli.models import model_spec
from dtrain_cli.plan.fit import memory_warning
from dtrain_cli.plan.steptime import peak_memory

FSDP8 = ["recipe=gpt_1b", "parallel.strategy=fsdp", "dp=8"]


def _warning(overrides: list[str]) -> str | None:
    """The plan's own warning (``compose_and_plan``: the plan every command prints)."""
    _, plan = compose_and_plan(overrides, [])
    said = [w for w in plan.warnings if w.startswith("peak memory per device")]
    assert len(said) <= 1
    return said[0] if said else None


def test_a_layout_above_the_device_is_named_with_a_micro_batch_that_fits():
    said = _warning(FSDP8)
    assert said.startswith("peak memory per device estimated at 1,942 GiB, above ")
    assert "hardware=h100_80g's 78 GiB; most of it activations" in said
    assert "train.micro_batch_size=16 (gradient accumulation keeps the global batch)" in said
    cfg, plan = compose_and_plan([*FSDP8, "train.micro_batch_size=16"], [])
    assert peak_memory(cfg, model_spec(cfg), plan, cfg.hardware).fits  # what it suggests fits
    assert memory_warning(cfg, model_spec(cfg), plan) is None


def test_under_looped_bfs_interleaved_1f1b_is_offered():
    """Looped BFS holds every micro-batch as GPipe does: it said 'no smaller micro-batch and
    no activation checkpointing fits; split the model' where interleaved 1F1B fits."""
    bfs = ["recipe=gpt_1b", "dp=16", "pp=4", "train.micro_batch_size=4"]
    bfs += ["pipeline.schedule=looped_bfs", "pipeline.virtual_stages=2"]
    said = _warning(bfs)
    assert "most of it activations (344 GiB): pipeline.schedule=interleaved_1f1b;" in said
    cfg, plan = compose_and_plan([*bfs, "pipeline.schedule=interleaved_1f1b"], [])
    assert peak_memory(cfg, model_spec(cfg), plan, cfg.hardware).fits  # what it suggests fits


def test_under_gpipe_a_smaller_micro_batch_is_not_offered_but_1f1b_with_one_is():
    """Under GPipe every micro-batch is in flight: a smaller one keeps the peak, and each
    candidate is planned whole, so none is offered alone; 1F1B holds a stage count of
    them, and with a smaller micro-batch it fits. Without a way to plan, no figure."""
    gpipe = ["recipe=gpt_1b", "dp=8", "pp=8", "pipeline.schedule=gpipe"]
    said = _warning(gpipe)
    assert "most of it activations" in said
    assert ": pipeline.schedule=1f1b with train.micro_batch_size=16; dtrain advise" in said
    cfg, plan = compose_and_plan(
        [*gpipe, "pipeline.schedule=1f1b", "train.micro_batch_size=16"], []
    )
    assert peak_memory(cfg, model_spec(cfg), plan, cfg.hardware).fits  # what it suggests fits
    cfg, plan = compose_and_plan([*gpipe, "train.micro_batch_size=16"], [])
    assert not peak_memory(cfg, model_spec(cfg), plan, cfg.hardware).fits  # 1F1B is the fix
    cfg, plan = compose_and_plan(FSDP8, [])
    unplanned = memory_warning(cfg, model_spec(cfg), plan)  # no replan: no figure named
    assert "a smaller train.micro_batch_size or parallel.activation_checkpointing" in unplanned
    # FSDP8's micro-batch of 512 does not fit with checkpointing either: only the smaller
    # micro-batch is offered
    assert "activation_checkpointing" not in _warning(FSDP8)


def test_where_neither_alone_fits_checkpointing_with_a_smaller_micro_batch_is_offered():
    """98,304 tokens a sample, micro-batch 2: micro-batch 1 alone and checkpointing at 2
    are both above 78 GiB; the two together fit."""
    long = [*FSDP8[:2], "dp=64", "train.global_batch_size=128", "model.block_size=98304"]
    said = _warning(long)
    assert ": parallel.activation_checkpointing=full with train.micro_batch_size=1; " in said
    for alone in ("train.micro_batch_size=1", "parallel.activation_checkpointing=full"):
        cfg, plan = compose_and_plan([*long, alone], [])
        assert not peak_memory(cfg, model_spec(cfg), plan, cfg.hardware).fits
    both = ["train.micro_batch_size=1", "parallel.activation_checkpointing=full"]
    cfg, plan = compose_and_plan([*long, *both], [])
    assert peak_memory(cfg, model_spec(cfg), plan, cfg.hardware).fits


def test_where_nothing_fits_it_says_split_the_model():
    """Micro-batch 1 of 262,144 tokens: checkpointing alone leaves it above 78 GiB."""
    said = _warning([*FSDP8[:2], "dp=64", "train.global_batch_size=64", "model.block_size=262144"])
    assert said.endswith(
        "no smaller micro-batch and no activation checkpointing fits; split the model "
        "(tp, pp); dtrain advise ranks the layouts that fit"
    )


def test_checkpointing_is_offered_where_it_fits_and_no_smaller_micro_batch_exists():
    """Micro-batch 1 of 65,536 tokens: nothing smaller, full checkpointing fits."""
    said = _warning([*FSDP8[:2], "dp=64", "train.global_batch_size=64", "model.block_size=65536"])
    assert said.endswith(
        "most of it activations (109 GiB): parallel.activation_checkpointing=full; dtrain "
        "advise ranks the layouts that fit"
    )


def test_the_cpu_profile_says_nothing_of_a_cuda_run():
    cfg, plan = compose_and_plan([*FSDP8, "hardware=cpu"], [])
    assert memory_warning(cfg, model_spec(cfg), plan) is not None  # planned on this CPU
    assert memory_warning(cfg, model_spec(cfg), replace(plan, device="cuda")) is None


def test_the_plan_command_prints_it():
    result = CliRunner().invoke(app, ["plan", *FSDP8], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "warning: peak memory per device estimated at 1,942 GiB" in result.output
    assert _warning(["recipe=gpt_tiny", "dp=2"]) is None


def test_a_cpu_plan_this_machine_cannot_hold_or_crowds_is_named():
    """``dtrain plan recipe=gpt_1b dp=8 tp=8 pp=2`` planned 128 CPU ranks here without a
    word: launched, each would build its 1.4 GiB share (168 GiB with a micro-batch's
    activations). Far more ranks than cores is said too; a laptop's dp=4 pp=2 is not."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.plan.build import Resources, build_plan
    from dtrain_cli.plan.fit import host_warnings

    laptop = Resources(num_gpus=0, num_cpus=2)
    gib = 1024**3

    def said(*overrides: str) -> list[str]:
        plan = build_plan(compose_config(overrides[0], list(overrides[1:])), laptop)
        return host_warnings(plan, 2, 24 * gib)

    (big,) = said("gpt_1b", "dp=8", "tp=8", "pp=2")
    assert big.startswith("128 process(es) on this machine would hold about 21,450 GiB (168")
    assert big.endswith("above its 24 GiB of memory: plan it for its cluster (dtrain sbatch, "
                        "dtrain k8s) or run one rank of it (dtrain simulate)")  # fmt: skip
    (crowded,) = said("gpt_tiny", "dp=64", "train.global_batch_size=64")
    assert crowded.startswith("64 processes on this machine's 2 CPU core(s) take turns (each "
                              "step about 32x slower")  # fmt: skip
    assert said("gpt_small", "dp=4", "pp=2") == []


def test_the_shells_omp_num_threads_is_kept_and_oversubscription_said(monkeypatch):
    """`OMP_NUM_THREADS=1 dtrain launch recipe=gpt_tiny` ran 2 threads a rank (the plan set
    torch's count from the cores over the processes, over the user's); torchrun keeps it.
    More threads than cores was accepted without a word."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.plan.build import Resources, build_plan

    def planned(*over: str, omp: int | None) -> tuple[int, list[str]]:
        cfg = compose_config("gpt_tiny", list(over), [])
        plan = build_plan(cfg, Resources(num_gpus=0, num_cpus=2, omp_threads=omp))
        return plan.threads_per_proc, [w for w in plan.warnings if "oversubscribed" in w]

    assert planned(omp=None) == (2, [])  # the cores over one process
    assert planned(omp=1) == (1, [])  # the shell's, as torchrun keeps it
    assert planned("launcher.threads_per_proc=2", omp=1) == (2, [])  # the config's first
    threads, said = planned("dp=2", omp=4)
    assert threads == 4 and said == [
        "OMP_NUM_THREADS=4 x 2 processes = 8 threads on 2 cores: oversubscribed (each step "
        "waits on threads the cores cannot run at once); at most 1 per process"
    ]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert Resources.detect().omp_threads == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "zero")
    assert Resources.detect().omp_threads is None
