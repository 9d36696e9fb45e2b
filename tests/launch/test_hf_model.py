"""``model=hf`` on 2 gloo ranks (torch.multiprocessing, spawn): tensor parallel from
``base_model_tp_plan``, a pipeline split and FSDP of a tied-embedding model equal one process;
and the hf module imports no torch (a fresh interpreter). The single-process checks:
tests/unit/test_hf_model.py."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from dtrain_cli.models.hf import HFSpec
from tests.unit.test_hf_model import VOCAB, Stage, built, spec_of, tokens


def _sgd_losses(
    model: torch.nn.Module, spec: HFSpec, steps: int, shard: slice, on_logits: bool = False
) -> list[float]:
    """SGD steps on the global batch of 4; this rank computes the loss of rows ``shard``
    (the mean over ranks is the global loss) and returns the global loss of each step."""
    import torch.distributed as dist

    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    out = []
    for _ in range(steps):
        x, y = tokens(batch=4, seed=10)  # one batch: the loss must fall
        if on_logits:  # a stage: logits out, the pipeline's loss
            loss = spec.loss(model(x[shard]), y[shard])
        else:
            loss = spec.forward_loss(model, x[shard], y[shard])
        loss.backward()
        opt.step()
        opt.zero_grad()
        value = loss.detach().clone()
        if shard != slice(None):  # a data-parallel rank: the global loss is the ranks' mean
            dist.all_reduce(value)
            value /= dist.get_world_size()
        out.append(value.item())
    return out


def _pipeline_losses(spec: HFSpec, rank: int, steps: int) -> list[float]:
    """GPipe over 2 ranks (layers 0-1 | 2-3 + norm + head), 2 micro-batches of 2: the last
    stage's mean micro-batch loss is the global batch's loss."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    first = rank == 0
    part = spec.pipeline_stage(
        built(spec), Stage([0, 2], True, False) if first else Stage([2, 4], False, True)
    )
    stage = PipelineStage(part, rank, 2, torch.device("cpu"), group=dist.group.WORLD)
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=spec.loss)
    opt = torch.optim.SGD(part.parameters(), lr=0.2)
    out = []
    for _ in range(steps):
        x, y = tokens(batch=4, seed=10)
        losses: list[torch.Tensor] = []
        if first:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        opt.step()
        opt.zero_grad()
        out.append(torch.stack(losses).mean().item() if losses else float("nan"))
    return out


def _worker(rank: int, store: str, ckpt: str, queue: object) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # a file store: no port picked here that another test could take before it is bound
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    torch.set_num_threads(1)
    # tensor parallel (every rank sees the whole batch) from Llama's own base_model_tp_plan
    spec = spec_of("llama")
    model = built(spec)
    spec.apply_tensor_parallel(model, mesh)
    q = model.model.layers[0].self_attn.q_proj.weight
    tp = (_sgd_losses(model, spec, 3, slice(None)), tuple(q.to_local().shape))
    # the same on a stage holding the whole model (what tp=2 pp=N applies TP to)
    part = spec.pipeline_stage(built(spec), Stage([0, 4], True, True))
    spec.apply_tensor_parallel(part, mesh)
    head = part.lm_head.weight.to_local().shape, part.model.embed_tokens.weight.to_local().shape
    assert head == ((VOCAB // 2, 64), (VOCAB // 2, 64)), head
    tp_stage = _sgd_losses(part, spec, 3, slice(None), on_logits=True)
    pp = _pipeline_losses(spec, rank, 3)
    # FSDP of a tied-embedding GPT-2: its blocks, then the root (embedding, norm, head together)
    spec = spec_of("gpt2")
    model = built(spec)
    assert model.lm_head.weight is model.transformer.wte.weight
    for unit in spec.fsdp_units(model):
        fully_shard(unit, mesh=mesh)
    assert spec.fsdp_root_extras(model) == []
    fully_shard(model, mesh=mesh)
    fsdp = _sgd_losses(model, spec, 3, slice(rank * 2, rank * 2 + 2))
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=ckpt)  # as dtrain saves
    queue.put((rank, tp, tp_stage, pp, fsdp))  # type: ignore[attr-defined]
    # ends as dtrain's forked ranks end: no rank closes its gloo pairs while the other still
    # uses them, then no interpreter teardown of the groups the models still hold (one CI
    # run in about fifteen saw rank 1 abort here: "terminate called without an active
    # exception", a gloo thread left joinable)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.multiproc
def test_tp_pp_and_tied_fsdp_on_two_ranks_equal_one_process(tmp_path):
    import torch.distributed.checkpoint as dcp
    import torch.multiprocessing as mp

    llama, gpt2 = spec_of("llama"), spec_of("gpt2")
    ref_llama = _sgd_losses(built(llama), llama, 3, slice(None))
    reference = built(gpt2)
    ref_gpt2 = _sgd_losses(reference, gpt2, 3, slice(None))
    ckpt = str(tmp_path / "ckpt")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = str(tmp_path / "store")
    mp.start_processes(_worker, args=(store, ckpt, queue), nprocs=2, start_method="spawn")
    for rank, (tp, q_shape), tp_stage, pp, fsdp in sorted(queue.get() for _ in range(2)):
        assert q_shape == (32, 64), f"rank {rank}: q_proj not split by columns: {q_shape}"
        assert max(abs(a - b) for a, b in zip(tp, ref_llama, strict=True)) < 1e-5, (rank, tp)
        assert max(abs(a - b) for a, b in zip(tp_stage, ref_llama, strict=True)) < 1e-5, rank
        assert max(abs(a - b) for a, b in zip(fsdp, ref_gpt2, strict=True)) < 1e-5, (rank, fsdp)
        if rank == 1:  # the last stage has the loss
            assert max(abs(a - b) for a, b in zip(pp, ref_llama, strict=True)) < 1e-5, pp
    assert ref_llama[-1] < ref_llama[0] and ref_gpt2[-1] < ref_gpt2[0]
    # the sharded tied checkpoint loads into a plain model (dtrain export does this) and
    # holds the single-process weights, the tie intact
    plain = built(gpt2, seed=5)
    state = {"model": plain.state_dict()}
    dcp.load(state, checkpoint_id=ckpt, no_dist=True)
    plain.load_state_dict(state["model"])
    assert plain.lm_head.weight is plain.transformer.wte.weight
    for (name, p), q in zip(plain.named_parameters(), reference.parameters(), strict=True):
        assert (p - q).abs().max().item() < 1e-6, name


def test_hf_module_imports_no_torch():
    import subprocess

    code = (
        "import sys, dtrain_cli.models.hf\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
