"""dtrain simulate end to end: each simulated rank is a subprocess on the fake backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import DTRAIN, REPO, cache_dir, run_dtrain, session_processes

pytestmark = pytest.mark.multiproc


def _simulate(tmp_path, *args: str, timeout: float = 240, fresh: bool = False) -> list[dict]:
    run = run_dtrain(["simulate", *args, "--json"], tmp_path, timeout=timeout, fresh=fresh)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def test_gpt_1b_world_1024_rank_holds_its_exact_shard(tmp_path):
    """As a user starts it: a fresh ``python -m dtrain_cli``, its ranks' fork server a
    fresh interpreter too (the other tests fork them from the warm launcher)."""
    (doc,) = _simulate(
        tmp_path, "recipe=gpt_1b", "dp=64", "tp=8", "pp=2", "parallel.nnodes=128", "--ranks", "0",
        fresh=True,
    )  # fmt: skip
    (rank,) = doc["ranks"]
    assert doc["world_size"] == 1024 and rank["compute"] == "fake"
    assert rank["params_count"] == rank["params_count_exact"] == 92_738_560
    assert rank["bytes"]["params"]["measured"] == rank["bytes"]["params"]["exact"]
    # the plan's count is of the fullest rank, this one: the embeddings, and the position
    # one whole on every tp rank (it said 0.98 of it: the whole spread over the stages)
    assert doc["estimates"]["params_per_rank"] == 92_738_560
    ops = {(c["op"], c["axis"]) for c in rank["collectives"]}
    assert ("allreduce", "dp") in ops and ("send", "pp") in ops and ("all_reduce", "tp") in ops


def test_a_rank_above_its_devices_memory_is_said_beside_the_table(tmp_path):
    """gpt_1b at dp=64 under FSDP keeps micro-batches of 64 (its global batch 4,096): the
    simulated rank measures what the plan said, 243 GiB for an 80 GB H100, and the
    simulation says so, with the micro-batch whose plan fits."""
    (doc,) = _simulate(
        tmp_path, "recipe=gpt_1b", "parallel.strategy=fsdp", "dp=64", "parallel.nnodes=8",
        "--ranks", "0", "--steps", "1",
    )  # fmt: skip
    (rank,) = doc["ranks"]
    assert rank["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.01)
    (note,) = [n for n in doc["notes"] if n.startswith("peak memory per device")]
    assert note.startswith("peak memory per device estimated at 243 GiB, above hardware=h100")
    assert "train.micro_batch_size=16" in note


def test_llama_tiny_hf_world_512_fsdp(tmp_path):
    (doc,) = _simulate(
        tmp_path,
        "recipe=llama_tiny_hf",
        "dp=512",
        "parallel.nnodes=64",
        "parallel.nproc_per_node=8",
        "parallel.strategy=fsdp",
        "train.global_batch_size=512",
        "--ranks",
        "0,511",
        "--steps",
        "1",
    )
    for rank in doc["ranks"]:
        assert rank["params_count"] == rank["params_count_exact"]
        # the plan measures one window's forward under fake tensors (SDPA, SwiGLU, GQA)
        assert rank["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.01)
        assert rank["bytes"]["dp_bytes_per_step"]["ratio"] == pytest.approx(1.0, abs=0.01)
    first, last = doc["ranks"]
    assert first["params_count"] > last["params_count"]  # uneven chunks
    # FSDP2 pads every rank's shard to the first one's rows: the last rank holds fewer
    # elements (none of some tensors) in storages as large as rank 0's
    assert last["params_allocated"] == first["params_allocated"] == first["params_count"]
    for what in ("params", "grads"):
        assert last["bytes"][what]["measured"] == first["bytes"][what]["measured"], what
    assert last["bytes"]["params"]["measured"] == last["bytes"]["params"]["exact"]
    # its optimizer state is made like its unpadded shard, and said to be
    assert last["bytes"]["optimizer"]["measured"] < first["bytes"]["optimizer"]["measured"]
    assert "fullest rank" in last["bytes"]["optimizer"]["note"]


def test_fsdp_collective_counts(tmp_path):
    """FSDP over dp=128 with k=4 wrapped blocks and the root: k+1 all-gathers in forward,
    k+1 again in backward (parameters resharded after forward), k+1 reduce-scatters."""
    (doc,) = _simulate(
        tmp_path,
        "recipe=gpt_tiny",
        "dp=128",
        "parallel.strategy=fsdp",
        "parallel.nnodes=16",
        "train.global_batch_size=128",
        "--ranks",
        "5",
    )
    counts = {(c["op"], c["axis"]): c["count"] for c in doc["ranks"][0]["collectives"]}
    k = 4
    assert counts == {("allgather_base", "dp"): 2 * (k + 1), ("reduce_scatter_base", "dp"): k + 1}


def test_ddp_on_fake_tensors_measures_what_real_tensors_do(tmp_path):
    """torch's DistributedDataParallel (ZeRO-1: DDP and ZeroRedundancyOptimizer over it)
    built on fake tensors: its reducer's index tensors stay real
    (runtime/parallel/fake_ddp.py). Every measured byte and collective equals the same
    rank's run on real tensors."""
    docs = {}
    for compute in ("real", "fake"):
        args = ["recipe=gpt_tiny", "dp=8", "parallel.strategy=zero1", "--ranks", "3"]
        (tmp_path / compute).mkdir()
        (doc,) = _simulate(tmp_path / compute, *args, "--steps", "3", "--compute", compute)
        docs[compute] = doc["ranks"][0]
    real, fake = docs["real"], docs["fake"]
    assert (real["compute"], fake["compute"]) == ("real", "fake")
    measured = {k: v["measured"] for k, v in real["bytes"].items()}
    assert {k: v["measured"] for k, v in fake["bytes"].items()} == measured
    assert fake["collectives"] == real["collectives"]
    assert {(c["op"], c["axis"]) for c in fake["collectives"]} == {
        ("allreduce", "dp"),  # DDP's gradient bucket
        ("broadcast", "dp"),  # ZeroRedundancyOptimizer: each shard's owner sends it
    }
    assert fake["bytes"]["grads"]["ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("mode", "optimizer_words"),
    [(["sync.mode=diloco"], 4), (["sync.mode=param_server", "sync.servers=2"], 0)],
    ids=["diloco", "param_server"],
)
def test_sync_modes_hold_and_send_what_the_plan_says(tmp_path, mode, optimizer_words):
    """DiLoCo's outer state (anchor and momentum) is optimizer state on every worker; a
    parameter server's worker holds none and pushes its whole gradient to its two servers
    each step (a send and a reply per server, on the group it shares with them)."""
    (doc,) = _simulate(tmp_path, "recipe=gpt_tiny", "dp=2", *mode, "--ranks", "1")
    (rank,) = doc["ranks"]
    params = rank["params_count"]
    # AdamW's step counters (a scalar per tensor) are the bytes past the words per parameter
    measured = rank["bytes"]["optimizer"]["measured"]
    assert measured == pytest.approx(optimizer_words * 4 * params, rel=1e-4, abs=0)
    for what in ("params", "grads", "optimizer", "activations"):
        row = rank["bytes"][what]
        assert row["measured"] == pytest.approx(row["estimate"], rel=1e-4, abs=0), (what, row)
    ops = {(c["op"], c["axis"]): c["count"] for c in rank["collectives"]}
    if optimizer_words == 0:
        assert ops == {("send", "ps"): 2, ("recv", "ps"): 2}
        # the push: the gradient and a 5-word header per server; the plan: 4 B a parameter
        assert rank["bytes"]["dp_bytes_per_step"]["measured"] == 4 * params + 2 * 4 * 5
        assert rank["bytes"]["dp_bytes_per_step"]["ratio"] == pytest.approx(1.0, abs=1e-4)


def test_a_parameter_server_holds_and_sends_what_the_plan_says(tmp_path):
    """A server's own start-up and loop (the default ranks: worker 0 and the first server):
    it allocates only its shard of whole tensors and AdamW's two moments for it, steps with
    the averaged gradient, and answers each of the dp workers with its shard every step.
    The plan's share is even (half the model each), the shard whole tensors: close, and
    the count is the exact one."""
    (doc,) = _simulate(
        tmp_path, "recipe=gpt_tiny", "dp=2", "sync.mode=param_server", "sync.servers=2"
    )
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert sorted(ranks) == [0, 2]  # the servers: ranks 2 and 3
    server = ranks[2]
    assert server["coords"] == {"server": 0}
    n = server["params_count"]
    assert n == server["params_count_exact"] and 0 < n < doc["estimates"]["num_params"]
    rows = server["bytes"]
    assert rows["params"]["measured"] == rows["params"]["exact"] == 4 * n
    assert rows["params"]["ratio"] == pytest.approx(1.0, abs=0.1)
    assert rows["grads"]["measured"] == 4 * n
    # AdamW's two moments, 8 B a parameter (and a step count per tensor)
    assert rows["optimizer"]["measured"] == pytest.approx(2 * 4 * n, rel=1e-3)
    assert rows["optimizer"]["ratio"] == pytest.approx(1.0, abs=0.1)
    ops = {(c["op"], c["axis"]): c for c in server["collectives"]}
    assert ops[("send", "ps")]["count"] == 2  # a reply to each worker
    assert ops[("send", "ps")]["bytes_sent"] == 2 * (4 * n + 4 * 5)  # its shard, a header
    assert ("allreduce", "world") in ops  # grad_clip: the servers add their shards' squares
    assert rows["dp_bytes_per_step"]["ratio"] == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize(
    ("layout", "last"),
    [
        (["recipe=gpt_1b", "dp=512", "parallel.nnodes=64"], 511),
        (["recipe=llama_tiny_hf", "dp=256", "pp=2", "parallel.nnodes=64"], 255),
    ],
    ids=["gpt_1b_dp512", "llama_hf_dp256_pp2"],
)
def test_zero1_optimizer_state_is_whole_tensors_on_the_rank_holding_most(tmp_path, layout, last):
    """ZeroRedundancyOptimizer gives out whole tensors, largest first: at dp=512 gpt_1b's
    389 tensors leave rank 0 with the 103M-parameter embedding's AdamW state (786 MiB,
    37x an even share) and the last ranks with nothing; the plan estimates the rank holding
    most, the HF pipeline's from its stage's tensors (an even share was 37x under)."""
    (doc,) = _simulate(
        tmp_path, *layout, "parallel.strategy=zero1", "train.global_batch_size=512",
        "--ranks", f"0,{last}", "--steps", "1",
    )  # fmt: skip
    rank0, rank_last = doc["ranks"]
    first, end = rank0["bytes"]["optimizer"], rank_last["bytes"]["optimizer"]
    assert first["ratio"] == pytest.approx(1.0, abs=1e-3), first
    dp = int(next(a for a in layout if a.startswith("dp="))[3:])
    even = 2 * 4 * rank0["params_count"] / dp  # AdamW's two words, an even share
    assert first["measured"] > 4 * even
    assert end["measured"] < even
    # each shard's owner broadcasts it: a chain forwards (dp-1)/dp of the bytes per rank
    assert rank0["bytes"]["dp_bytes_per_step"]["ratio"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize(
    "layout",
    [["dp=2", "tp=2"], ["dp=4", "parallel.strategy=fsdp"]],
    ids=["autocast_over_fp32_tp2", "fsdp_bf16_params"],
)
def test_hf_bf16_activations_are_measured_not_scaled(tmp_path, layout):
    """precision=bf16 on the HF Llama: the plan measures the window's forward under autocast
    (over fp32 parameters, and with FSDP's bf16 parameters) instead of halving the fp32
    bytes; its RMSNorm computes in fp32, and autocast's bf16 copies of the weights are
    weights. The halved estimate was 1.54x under (autocast, tp=2), 1.12x (fsdp)."""
    (doc,) = _simulate(
        tmp_path, "recipe=llama_tiny_hf", "precision=bf16", *layout, "--ranks", "0",
        "--steps", "1",
    )  # fmt: skip
    assert doc["ranks"][0]["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(
    "layout",
    [["precision=fp32"], ["precision=bf16"], ["precision=bf16", "parallel.strategy=fsdp"]],
    ids=["fp32", "autocast_over_fp32", "fsdp_bf16_params"],
)
def test_own_model_activations_are_measured_as_its_run_keeps_them(tmp_path, layout):
    """A model of one's own (bench/own_model: SDPA, LayerNorm): the plan measures its
    forward on fake CPU tensors, where SDPA keeps no s x s scores and autocast keeps
    LayerNorm's fp32. On the meta device the plan said 1.35x (fp32), and 1.16x and 1.31x
    (bf16, halved) what a rank keeps."""
    (doc,) = _simulate(
        tmp_path, "recipe=own_lm", "--config-dir", str(REPO / "bench" / "own_model"), *layout,
        "dp=2", "--ranks", "0", "--steps", "1",
    )  # fmt: skip
    assert doc["ranks"][0]["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(
    "layout",
    [["precision=fp32"], ["precision=bf16"], ["model.image_size=33", "model.channels=[8,16,24]"]],
    ids=["fp32", "bf16", "odd_side_three_blocks"],
)
def test_cnn_activations_are_what_its_backward_keeps(tmp_path, layout):
    """recipe=cnn_bn: each block's BatchNorm input and ReLU output at its own resolution
    (stride 2 after the first block) and the image. The plan counted every block at the
    image's resolution, 12 bytes a value: 2.8x what a rank keeps (0.36 measured/plan)."""
    (doc,) = _simulate(tmp_path, "recipe=cnn_bn", "dp=2", *layout, "--ranks", "0", "--steps", "1")
    assert doc["ranks"][0]["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.02)


def _simulate_own_target(tmp_path, args: list[str]) -> dict:
    """Rank 0 of a one-step simulation of a model from tests/own_targets.py."""
    env = {"PYTHONPATH": f"{REPO / 'tests'}:{REPO}"}
    run = run_dtrain(["simulate", *args, "--ranks", "0", "--steps", "1", "--json"], tmp_path,
                     timeout=240, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (doc,) = json.loads(run.stdout)
    return doc


@pytest.mark.parametrize("units", [["parallel.fsdp_units=[AttnBlock]"], []], ids=["named", "found"])
def test_own_model_checkpoints_the_fsdp_units_it_names_as_planned(tmp_path, units):
    """Activation checkpointing wraps what FSDP wraps: the classes ``parallel.fsdp_units``
    names, else the largest nn.ModuleList's children (tests/own_targets.PairedLM: pairs of
    attention blocks). The plan counted the pairs either way, so with the blocks named it
    kept two checkpointed inputs where the run keeps four."""
    args = ["recipe=gpt_tiny", "model=custom", "model._target_=own_targets.PairedLM"]
    args += ["model.block_size=32", *units, "dp=2", "parallel.strategy=fsdp"]
    args += ["parallel.activation_checkpointing=full"]
    doc = _simulate_own_target(tmp_path, args)
    assert doc["ranks"][0]["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("blocks", [["pipeline.layers=blocks"], []], ids=["named", "found"])
def test_own_model_under_tensor_parallel_holds_and_sends_what_the_plan_says(tmp_path, blocks):
    """A model of one's own at dp=2 x tp=2, its MLP split by parallel.tp_plan, its blocks
    named (pipeline.layers) or found as FSDP finds them: parameters, activations and dp
    bytes as planned (the plan said 0.66x the parameters and dp bytes, and 0.90x the
    activations: it split every tensor and every saved tensor over tp; with the blocks
    not named, 0.73x the activations: it held them all outside any block)."""
    args = ["recipe=gpt_tiny", "model=custom", "model._target_=own_targets.TinyLM"]
    args += ["model.block_size=32", *blocks, "dp=2", "tp=2"]
    args += ["parallel.tp_plan={blocks.*.up:colwise,blocks.*.down:rowwise}"]
    doc = _simulate_own_target(tmp_path, args)
    measured = doc["ranks"][0]["bytes"]
    for what in ("params", "grads", "activations", "dp_bytes_per_step"):
        assert measured[what]["ratio"] == pytest.approx(1.0, abs=0.01), what


def test_math_attention_keeps_its_scores_on_every_mesh_dimension(tmp_path):
    """model.attention=math at tp x pp (the stages' shapes found on the meta device, under
    autocast): each rank keeps its heads' softmax (bf16, b x heads/tp x s x s) and the
    causal mask, what the plan adds to SDPA's bytes, to the byte on both stages."""
    kept = {}
    for attention in ("sdpa", "math"):
        (tmp_path / attention).mkdir()
        (doc,) = _simulate(
            tmp_path / attention, "recipe=gpt_tiny", f"model.attention={attention}",
            "precision=bf16", "dp=2", "tp=2", "pp=2", "--ranks", "0,4", "--steps", "1",
        )  # fmt: skip
        kept[attention] = [r["bytes"]["activations"] for r in doc["ranks"]]
    for sdpa, math in zip(kept["sdpa"], kept["math"], strict=True):
        added = math["measured"] - sdpa["measured"]
        assert added > 0.1 * sdpa["measured"]
        assert added == math["estimate"] - sdpa["estimate"]


@pytest.mark.parametrize("recipe", ["gpt_tiny", "llama_tiny_hf"])
def test_tensor_parallel_all_reduces_per_block(tmp_path, recipe):
    """Megatron's count: per block two all-reduces of the (b, s, d) activations in forward
    (the row-wise outputs) and two in backward (the column-wise inputs: q, k and v share
    one, the Llama's gate and up another), as the step-time estimate charges; plus the
    vocabulary-split embedding's output and the LM head's input gradient. (Each column-wise
    linear all-reducing its own input gradient made it 6 a GPT block, 7 a Llama layer.)"""
    (doc,) = _simulate(tmp_path, f"recipe={recipe}", "dp=2", "tp=2", "--ranks", "0", "--steps", "1")
    counts = {(c["op"], c["axis"]): c["count"] for c in doc["ranks"][0]["collectives"]}
    assert counts[("all_reduce", "tp")] == 4 * 4 + 2  # both recipes: 4 blocks
    # what a rank keeps: its heads' and its MLP slice's tensors, the residual stream and its
    # norms whole (the HF Llama's measured bytes were all divided by tp: 1.25 measured/plan)
    assert doc["ranks"][0]["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.02)


def test_gpt_1b_plain_ddp_world_1024_on_fake_tensors(tmp_path):
    """The 1.3B model replicated on every rank (5.4 GB of fp32 parameters, as much again of
    gradients, twice that of AdamW state): --compute auto picks fake tensors, nothing of
    that size is allocated here."""
    (doc,) = _simulate(
        tmp_path, "recipe=gpt_1b", "dp=1024", "parallel.nnodes=128", "--ranks", "0", "--steps", "1"
    )
    (rank,) = doc["ranks"]
    assert rank["compute"] == "fake"
    assert rank["params_count"] == rank["params_count_exact"] == doc["estimates"]["num_params"]
    for what in ("params", "grads", "optimizer", "dp_bytes_per_step"):
        assert rank["bytes"][what]["ratio"] == pytest.approx(1.0, abs=0.01), what


def test_layout_failing_at_scale_names_the_rank(tmp_path):
    model = ["model=custom", "model._target_=own_targets.WideOnly", "model.block_size=32"]
    args = [*model, "dp=128", "parallel.nnodes=16", "train.global_batch_size=128"]
    env = {"PYTHONPATH": f"{REPO / 'tests'}:{REPO}"}
    run = run_dtrain(["simulate", *args, "--ranks", "0"], tmp_path, timeout=180, env=env)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert "rank 0 (pp=0, dp=0, tp=0) of world 128" in run.stderr
    assert "does not divide over 128 ranks" in run.stderr
    assert "Traceback" not in run.stderr and len(lines) <= 3


def test_fsdp_tp_pp_runs_every_mesh_dimension(tmp_path):
    """FSDP2 + tensor parallel + pipeline at once, on fake tensors as a model too large for
    this machine runs (the simulator failed to convert the stages' fake DTensor parameters
    to bf16 when it computed their input shapes)."""
    (doc,) = _simulate(
        tmp_path,
        "recipe=gpt_tiny",
        "dp=2",
        "tp=2",
        "pp=2",
        "parallel.strategy=fsdp",
        "precision=bf16",
        "--ranks",
        "0,7",
        "--steps",
        "1",
        "--compute",
        "fake",
    )
    first, last = doc["ranks"]
    assert (first["rank"], last["rank"]) == (0, 7)
    for rank in (first, last):
        assert rank["params_count"] == rank["params_count_exact"]
        ops = {(c["op"], c["axis"]) for c in rank["collectives"]}
        assert ("reduce_scatter_base", "dp") in ops and ("all_reduce", "tp") in ops
    sent = {c["op"] for c in first["collectives"] if c["axis"] == "pp"}
    assert "send" in sent
    # 4 micro-batches: FSDP2 gathers in each forward and once in the pipeline's backward;
    # the plan's figures are the fullest rank's (rank 0: the embeddings, the position one
    # whole on both tp ranks), another stage holds and sends its share of them
    for rank in (first, last):
        for what in ("params", "grads", "optimizer", "dp_bytes_per_step"):
            assert rank["bytes"][what]["ratio"] == pytest.approx(1.0, abs=0.005), what
    sent, held = (
        last["bytes"][w]["measured"] / first["bytes"][w]["measured"]
        for w in ("dp_bytes_per_step", "params")
    )
    assert sent == pytest.approx(held, rel=0.005)
    # each stage against its own estimate (the last one keeps the logits, and its first
    # block the input received from the stage before: left out as a weight, 0.97 and less)
    for rank in (first, last):
        assert rank["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize(
    "layout",
    [
        ["recipe=gpt_tiny", "dp=8"],
        # a pipeline stage without the loss unscaled a GradScaler that never scaled:
        # 'Attempted unscale_ but _scale is None' (a CUDA launch's pp > 1 too)
        ["recipe=gpt_tiny", "dp=4", "pp=2", "--compute", "real"],
        # the GradScaler read its overflow flag with .item() on a fake tensor
        ["recipe=gpt_small", "dp=2", "--compute", "fake"],
    ],
    ids=["dp", "pp-stage-0", "fake"],
)
def test_fp16_cuda_plan_runs_here_and_says_so(tmp_path, layout):
    """precision=fp16 needs CUDA in a launch; simulate runs its autocast and GradScaler on
    CPU tensors for a plan made for the hardware profile, and says so."""
    (doc,) = _simulate(
        tmp_path, *layout, "hardware=h100_80g", "precision=fp16", "--ranks", "0", "--steps", "2"
    )
    assert any("precision=fp16" in note for note in doc["notes"])
    (rank,) = doc["ranks"]
    for what in ("params", "grads", "optimizer", "dp_bytes_per_step"):
        assert rank["bytes"][what]["ratio"] == pytest.approx(1.0, abs=0.02), what
    if layout[1] == "dp=8":
        assert rank["bytes"]["activations"]["ratio"] == pytest.approx(1.0, abs=0.02)


def test_each_pipeline_stage_keeps_the_activations_booked_on_it(tmp_path):
    """The embedding's input (token ids, positions) is kept by the first stage and the
    targets by the last: the plan books each where it is (it booked all on the last: rank 0
    measured 5,120 bytes over its estimate, rank 1 as many under)."""
    (doc,) = _simulate(tmp_path, "recipe=gpt_tiny", "pp=2", "--ranks", "0,1", "--steps", "1")
    first, last = doc["ranks"]
    for rank in (first, last):
        acts = rank["bytes"]["activations"]
        assert abs(acts["measured"] - acts["estimate"]) <= 8, acts  # a scalar loss at most


def test_a_sweep_prints_one_table_of_every_value_and_draws_the_plot(tmp_path):
    """``dp=2,4`` simulates each value, then one table (a row per value: the rank's
    parameters, gradients and optimizer state and its dp bytes per step against the plan,
    and the plan's peak per device against the hardware profile's memory) and the plot."""
    run = run_dtrain(
        ["simulate", "recipe=gpt_tiny", "parallel.strategy=fsdp", "dp=2,4", "--ranks", "0",
         "--out", str(tmp_path / "sweep")],
        tmp_path, timeout=240, env={"COLUMNS": "160"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split("│")[1:-1] for line in run.stdout.splitlines() if "│ dp=" in line]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("dp=2", "2"), ("dp=4", "4")]
    for r in rows:  # FSDP shards the state by dp: measured as planned, both figures
        assert r[4].strip() == "1.00" and r[7].strip() == "1.00", rows
    state = [float(r[2].split()[0]) for r in rows]
    assert state[1] == pytest.approx(state[0] / 2, rel=0.05)  # half the shard at dp=4
    for r, dp in zip(rows, (2, 4), strict=True):  # the plan's peak against the profile's
        assert r[8].strip() == _plan_peak(["recipe=gpt_tiny", "parallel.strategy=fsdp", f"dp={dp}"])
    plot = tmp_path / "sweep" / "simulate_sweep.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _plan_peak(overrides: list[str]) -> str:
    """What ``dtrain plan`` estimates as the peak per device, in the sweep's words."""
    from dtrain_cli.cli.common import compose_and_plan
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.render import bytes_text
    from dtrain_cli.plan.steptime import peak_memory

    cfg, plan = compose_and_plan(overrides, [])
    peak = peak_memory(cfg, model_spec(cfg), plan, cfg.hardware)
    assert peak.fits
    return f"{bytes_text(peak.total)} of {bytes_text(peak.capacity)}"


def test_ctrl_c_ends_a_simulation_and_every_rank_it_started(tmp_path):
    """SIGINT to ``dtrain simulate`` while a rank runs (a terminal's Ctrl-C, whose SIGINT
    a shell's background job would ignore): exit 130 with one line, no rank left."""
    out = tmp_path / "sim"
    proc = subprocess.Popen(
        [*DTRAIN, "simulate", "recipe=gpt_1b", "parallel.strategy=fsdp", "dp=64",
         "--ranks", "0", "--out", str(out)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "DTRAIN_CACHE": str(cache_dir())}, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not list(out.glob("*/simulate/rank_0.log")) and time.time() < deadline:
            time.sleep(0.2)
        assert list(out.glob("*/simulate/rank_0.log")), "rank 0 never started"
        time.sleep(1.0)  # inside the rank's start-up
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "error: stopped by SIGINT; no simulated rank left running"
    )
    deadline = time.time() + 5
    while session_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert session_processes(proc.pid) == []


@pytest.mark.parametrize(
    "args",
    [
        ["comm.compression=fp16"],
        ["comm.compression=powersgd", "--steps", "3"],
        ["sync.mode=local_sgd", "sync.warmup_steps=5"],
        ["sync.mode=diloco"],
    ],
    ids=["fp16", "powersgd", "local_sgd", "diloco"],
)
def test_communication_hooks_and_periodic_syncs_send_what_the_plan_says(tmp_path, args):
    """DDP's communication hooks read the reduced tensor from the collective's future, which
    the fake backend left empty: fp16, bf16 and PowerSGD compression and local SGD's warm-up
    failed in step 1 ('NoneType' object is not subscriptable). Local SGD and DiLoCo measured
    a step without a sync (ratio 0.00 against the plan's amortized bytes); the simulated
    rank now syncs at its last step, compared with one sync's bytes. PowerSGD's plan is its
    compressed step, measured from the third."""
    (doc,) = _simulate(tmp_path, "recipe=gpt_tiny", "dp=2", *args, "--ranks", "0")
    (rank,) = doc["ranks"]
    row = rank["bytes"]["dp_bytes_per_step"]
    assert row["ratio"] == pytest.approx(1.0, abs=0.01), row
    if "sync.mode" in args[0]:
        assert row["note"].startswith("one sync: the plan's 427.4 KiB a step x 8 steps")
