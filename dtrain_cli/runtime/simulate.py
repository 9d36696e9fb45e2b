"""One rank of a plan, on this machine: the worker's own start-up and steps on a fake
process group, measured. ``dtrain simulate`` starts one of these per rank it checks.

    python -m dtrain_cli.runtime.simulate RUN_DIR --rank 511 --steps 2 --out rank_511.json

What runs is what ``launch`` runs on that rank: :class:`.Trainer` (model build through the
model's spec, :func:`.parallelize`: pipeline stage, tensor parallel, activation
checkpointing, the strategy's wrapping; optimizers, checkpointer, data) and its
``train_step``, with two things replaced: the process group is torch's fake backend
(collectives return at once; their values are meaningless) and the device is the CPU. The
model is built on the meta device and only this rank's shards are allocated
(:mod:`.parallel.materialize`). ``--compute fake`` runs the steps under ``FakeTensorMode``
(shapes only: nothing allocated, no FLOPs) for models too large to compute here.
Measured (:mod:`.simulate_measure`): parameter, gradient and optimizer-state bytes, the
activations autograd keeps per micro-batch, every collective of the last step. A parameter
server's server rank runs its own start-up and loop instead (:func:`_simulate_server`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dtrain_cli.config.compose import config_from_yaml
from dtrain_cli.models import model_spec
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.runtime.parallel.mesh import DistContext, build_mesh, mesh_coordinates
from dtrain_cli.runtime.simulate_measure import (
    CommCounter,
    CountedGroup,
    SavedBytesMeter,
    storage_bytes,
    tensor_bytes,
)
from dtrain_cli.sync_modes.base import mode_for


def init_fake(plan: Plan, rank: int) -> DistContext:
    """The fake process group and the plan's mesh, as :func:`.init_distributed` builds it
    (a parameter server's layout, as :func:`.mesh._init_param_server`: workers and servers
    each a default group of their own, the servers no mesh, and one fake group of all for
    the point-to-point messages, counted)."""
    from torch._C._distributed_c10d import FakeProcessGroup
    from torch.testing._internal.distributed.fake_pg import FakeStore

    servers = len(plan.sync.servers) if plan.sync is not None else 0
    workers = plan.world_size - servers
    shard = plan.sync.server_of(rank) if plan.sync is not None else None
    server = shard is not None
    own, size = (shard.shard, servers) if shard is not None else (rank, workers)
    for key, value in (("RANK", own), ("WORLD_SIZE", size), ("LOCAL_RANK", 0)):
        os.environ[key] = str(value)
    dist.init_process_group("fake", store=FakeStore(), rank=own, world_size=size)
    _all_reduce_futures_hold_their_tensor()
    device = torch.device("cpu")
    ps = None
    if servers:
        fake = FakeProcessGroup._create_internal(rank, plan.world_size, FakeProcessGroup.Options())
        ps = CountedGroup(fake)
    return DistContext(
        rank=rank,
        world_size=size,
        local_rank=rank % max(plan.nproc_per_node, 1),
        restart_count=0,
        device=device,
        mesh=None if server else build_mesh(plan, device),  # type: ignore[arg-type]
        dims=plan.dims,
        role="server" if server else "worker",
        ps=ps,
        simulated=True,
    )


def _compressed_at_last_step(cfg: Any, steps: int) -> str | None:
    """PowerSGD compresses after ``comm.powersgd_start_iter`` exact steps (at least two:
    torch's error feedback needs them): from the last simulated step where it can, as the
    plan's bytes assume; else why the measured step is an exact all-reduce."""
    if cfg.comm.compression != "powersgd":
        return None
    if steps >= 3:
        cfg.comm.powersgd_start_iter = min(cfg.comm.powersgd_start_iter, steps - 1)
        return None
    return "PowerSGD's first two steps are exact all-reduces: --steps 3 measures a compressed one"


class _HeldWork:
    """A fake collective's work whose future holds its tensors, as a real backend's does."""

    def __init__(self, work: Any, tensors: list[torch.Tensor]) -> None:
        self._work, self._future = work, torch.futures.Future()
        self._future.set_result(tensors)

    def get_future(self) -> torch.futures.Future:
        return self._future

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _all_reduce_futures_hold_their_tensor() -> None:
    """The fake backend's work futures complete empty; torch's DDP communication hooks
    (fp16/bf16 compression, PowerSGD, post-local-SGD's warm-up) read the reduced tensor from
    them (``fut.value()[0]``). The collective itself still goes to the fake group, counted."""
    real = dist.all_reduce

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = real(tensor, *args, **kwargs)
        return None if work is None else _HeldWork(work, [tensor])

    dist.all_reduce = all_reduce


def _agree_on_static_shapes() -> None:
    """A pipeline stage votes with its neighbours (a send/recv) on whether every stage
    knows its shapes; a fake recv returns nothing, so answer as the real ranks would: every
    simulated stage is given its shapes (:func:`.pipeline.stage_io_meta`)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.pipelining.schedules import _PipelineSchedule
    from torch.distributed.pipelining.stage import PipelineStage

    def yes(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.ones(1, dtype=torch.int32, device=self.device)

    PipelineStage._warmup_forward_vote = yes  # type: ignore[method-assign]
    PipelineStage._warmup_backward_result = yes  # type: ignore[method-assign]
    warmup = _PipelineSchedule._warmup_p2p

    def real_warmup(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():  # the vote is read with .item()
            return warmup(*args, **kwargs)

    _PipelineSchedule._warmup_p2p = real_warmup  # type: ignore[method-assign]


def _step_without_reading_found_inf() -> None:
    """fp16's GradScaler steps only when its overflow flags are clear, read with ``.item()``:
    a fake tensor has no value, and a real one holds what the fake collectives left (a
    pipeline stage's received gradients are meaningless), so a simulated step always steps
    (the path of a step without overflow, whose optimizer state is what a run holds)."""

    def step(self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    torch.amp.GradScaler._maybe_opt_step = step  # type: ignore[method-assign]


def _outside_fake_mode(cls: type) -> None:
    """Every method of ``cls`` runs on real tensors under ``FakeTensorMode``: DeviceMesh
    keeps its rank table in tensors (its look-ups have no fake shape), and the data loader
    reads real samples (they enter the fake step as inputs)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def real(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with unset_fake_temporarily():
                return fn(*args, **kwargs)

        return call

    for name, attr in list(vars(cls).items()):
        if isinstance(attr, property) and attr.fget is not None:
            setattr(cls, name, property(real(attr.fget)))
        elif isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(real(attr.__func__)))
        elif callable(attr) and not isinstance(attr, type) and name != "__class__":
            setattr(cls, name, real(attr))


def simulate_rank(run_dir: Path, rank: int, steps: int, compute: str) -> dict[str, Any]:
    """Start-up and ``steps`` training steps of ``rank``; what it held and sent."""
    from dtrain_cli.runtime.trainer import Trainer

    run = RunDir(run_dir)
    plan = Plan.load(run.plan)
    plan = replace(plan, device="cpu", backend="fake")
    cfg = config_from_yaml(run.config)
    if plan.sync is not None and plan.sync.every > 1:  # local SGD, DiLoCo: one sync measured
        mode_for(cfg.sync.mode).sync_at(cfg, steps - 1)
    note = _compressed_at_last_step(cfg, steps)
    for root in reversed(cfg.run.import_roots):
        if root not in sys.path:
            sys.path.insert(0, root)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ctx = init_fake(plan, rank)
    if ctx.role == "server":
        return _simulate_server(cfg, plan, ctx, steps, t0)
    _agree_on_static_shapes()
    _step_without_reading_found_inf()
    fake = compute == "fake"
    if fake:
        from torch.distributed.device_mesh import DeviceMesh

        from dtrain_cli.runtime.data.loader import Batches

        for cls in (DeviceMesh, Batches):
            _outside_fake_mode(cls)
    out: dict[str, Any] = {"rank": rank, "coords": mesh_coordinates(ctx), "compute": compute}
    if note:
        out["dp_note"] = note
    with contextlib.ExitStack() as mode:
        if fake:  # the model's own forward path, on tensors that hold no data
            from torch._subclasses.fake_tensor import FakeTensorMode

            mode.enter_context(model_spec(cfg).fake_tensor_context())
            mode.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        trainer = Trainer(cfg, plan, ctx, run.path, None)
        out["startup_s"] = round(time.perf_counter() - t0, 3)
        out.update(_run_steps(trainer, ctx, steps))
    out["params_bytes"] = storage_bytes(trainer.pm.parameters())
    out["params_count"] = sum(tensor_bytes(p, count=True) for p in trainer.pm.parameters())
    out["optimizer_bytes"] = trainer.optimizer_state_bytes()
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


def _run_steps(trainer: Any, ctx: DistContext, steps: int) -> dict[str, Any]:
    """The trainer's own ``train_step``; gradients and activations measured around its
    step runner, collectives counted over the last step."""
    grads: list[int] = []
    meter = SavedBytesMeter()
    run_step = trainer.step_fn

    def measured(batches: Any, step: int) -> torch.Tensor:
        with meter:
            loss = run_step(batches, step)
        grads.append(storage_bytes(p.grad for p in trainer.pm.parameters() if p.grad is not None))
        return loss

    trainer.step_fn = measured
    counter = CommCounter(ctx)
    for k in range(steps):
        with counter if k == steps - 1 else contextlib.nullcontext():
            trainer.train_step(want_norm=False)
        trainer.step += 1
    plan = trainer.plan
    micro = plan.batch.grad_accum if plan.pipeline is None else plan.pipeline.microbatches
    calls = 1 if plan.pipeline is None else plan.pipeline.calls_per_step
    return {
        "steps": steps,
        "grads_bytes": max(grads, default=0),
        "activation_bytes": meter.peak_step_bytes // max(micro * calls, 1),
        "collectives": counter.rows(),
    }


def _simulate_server(
    cfg: Any, plan: Plan, ctx: DistContext, steps: int, t0: float
) -> dict[str, Any]:
    """A parameter server's start-up (its shard and optimizer state) and ``steps`` steps of
    its own loop (:class:`.ServerLoop`: every worker's push, the update, the replies). A
    fake recv carries no message, so the messages its workers send come in as the loop's
    input, in their order: worker 0's parameters, then each worker's gradient each step
    (shapes of the real ones, values meaningless)."""
    from dtrain_cli.runtime.sync.param_server import INIT, PUSH, ServerLoop, _message, model_shapes

    loop = ServerLoop(cfg, plan, ctx.ps, ctx.rank, model_shapes(cfg))
    body = torch.zeros(loop.shard.numel)
    loop.handle(0, _message(INIT, 0, 0, 0, body))
    out: dict[str, Any] = {"rank": ctx.rank, "coords": {"server": loop.index}, "compute": "real"}
    out["startup_s"] = round(time.perf_counter() - t0, 3)
    counter = CommCounter(ctx)
    for step in range(steps):
        with counter if step == steps - 1 else contextlib.nullcontext():
            for worker in range(len(plan.sync.workers)):  # type: ignore[union-attr]
                loop.handle(worker, _message(PUSH, step, step, 0.0, body))
    shard = loop.shard
    out["params_count"] = shard.numel
    out["params_bytes"] = sum(tensor_bytes(p) for p in shard.params)
    out["grads_bytes"] = sum(tensor_bytes(p.grad) for p in shard.params if p.grad is not None)
    out["optimizer_bytes"] = sum(
        tensor_bytes(v) for st in shard.optimizer.state.values() for v in st.values()
    )
    out.update(steps=steps, activation_bytes=0, collectives=counter.rows())
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dtrain_cli.runtime.simulate")
    ap.add_argument("run_dir")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--compute", choices=("real", "fake"), default="real")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        result = simulate_rank(Path(args.run_dir), args.rank, args.steps, args.compute)
        result["ok"] = True
    except Exception as exc:  # the one line the CLI shows, the traceback kept beside it
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        result = {"rank": args.rank, "ok": False, "error": line}
        result["traceback"] = traceback.format_exc()
    Path(args.out).write_text(json.dumps(result, indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
