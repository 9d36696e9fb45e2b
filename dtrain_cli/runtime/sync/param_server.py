"""Parameter server with bounded staleness (stale-synchronous parallel).

    dtrain launch recipe=gpt_small dp=4 sync.mode=param_server sync.servers=2 sync.max_staleness=2

Ranks ``0..dp-1`` are workers, ranks ``dp..`` servers (:mod:`dtrain_cli.plan.sync`). Each
server holds whole parameter tensors (balanced by size) and their optimizer state, and
applies gradients; workers compute gradients, push them, and pull the parameters back.

Why point-to-point on a gloo group of its own (``ctx.ps``), not collectives or rpc:
``torch.distributed.rpc`` is no longer developed; a collective needs every member at the
same call, which is exactly what an asynchronous server must not wait for; gloo's
``recv_anysource`` lets one server loop take gradients in arrival order. Workers keep
their own default process group (and mesh) without the servers, so every collective of the
loop (logging, validation, checkpoints) runs among workers only.

Clocks: a worker at step ``t`` may compute on parameters in which every worker's
gradients of steps ``< t - k`` are applied (``k = sync.max_staleness``); the staleness of
its update is ``t - rounds`` where ``rounds`` is how many steps of *all* workers the
parameters it read contain. ``k = 0`` is synchronous SGD: the server waits for all ``dp``
gradients of a step, sums them in worker order, divides by ``dp`` and applies once with the
step's learning rate, as DDP's averaged gradient. ``k > 0``: each gradient is applied as it
arrives, with the step's learning rate divided by ``dp`` (``dp`` such updates move as far
as one synchronous step). Clipping (``optim.grad_clip``): ``k = 0`` clips the averaged
gradient by its global norm (servers add their shards' squares); ``k > 0`` clips each
gradient by its worker's own norm.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.runtime.state.optim import build_optimizer
from dtrain_cli.sync_modes.param_server import HEADER_WORDS, assign_shards, optim_slots

log = logging.getLogger("dtrain")

HELLO, PUSH, PULL, DONE, INIT, SNAPSHOT, REPLY = range(7)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def _unflat(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, pos = [], 0
    for t in like:
        out.append(flat[pos : pos + t.numel()].view_as(t))
        pos += t.numel()
    return out


def _message(
    kind: int, a: float, b: float, c: float, body: torch.Tensor, d: float = 0.0
) -> torch.Tensor:
    head = torch.tensor([kind, a, b, c, d], dtype=torch.float32)
    return torch.cat([head, body.float()])


class Shard:
    """One server's parameters and optimizer (the same param groups as the workers')."""

    def __init__(self, cfg: DtrainConfig, plan: Plan, params: list[torch.Tensor]) -> None:
        # shapes only (meta tensors): the values come from worker 0 (INIT) before any use
        self.params = [nn.Parameter(torch.empty_like(p, device="cpu")) for p in params]
        holder = nn.ParameterList(self.params)
        self.optimizer = build_optimizer(holder, cfg.optim, plan.lr.peak_lr)
        self.slots = optim_slots(cfg)
        self.numel = sum(p.numel() for p in self.params)
        self.state_numel = len(self.slots) * self.numel + 1  # + the step count
        for p in self.params:  # state exists from the start: checkpoints have fixed shapes
            if self.slots:
                self.optimizer.state[p] = {s: torch.zeros_like(p) for s in self.slots}
                if cfg.optim.name == "adamw":
                    self.optimizer.state[p]["step"] = torch.tensor(0.0)
        self.steps_applied = 0

    def apply(self, grad: torch.Tensor, lr: float) -> None:
        for p, g in zip(self.params, _unflat(grad, self.params), strict=True):
            p.grad = g.clone()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.steps_applied += 1

    def state_flat(self) -> torch.Tensor:
        parts = [self.optimizer.state[p][s] for s in self.slots for p in self.params]
        return torch.cat([_flat(parts), torch.tensor([float(self.steps_applied)])])

    def load_state_flat(self, flat: torch.Tensor) -> None:
        self.steps_applied = int(flat[-1])
        pos = 0
        for s in self.slots:
            for p in self.params:
                self.optimizer.state[p][s].copy_(flat[pos : pos + p.numel()].view_as(p))
                pos += p.numel()
        for p in self.params:
            if "step" in self.optimizer.state.get(p, {}):
                self.optimizer.state[p]["step"] = torch.tensor(float(self.steps_applied))


class ServerLoop:
    """A server rank's whole life: take messages in arrival order until every worker is
    done. Pull replies are deferred while the bound says the worker must wait."""

    def __init__(
        self, cfg: DtrainConfig, plan: Plan, ps: Any, rank: int, params: list[torch.Tensor]
    ) -> None:
        assert plan.sync is not None
        self.cfg, self.plan, self.ps, self.rank = cfg, plan, ps, rank
        self.dp = plan.batch.dp
        self.k = plan.sync.max_staleness
        self.index = rank - self.dp
        sizes = [p.numel() for p in params]
        mine = assign_shards(sizes, len(plan.sync.servers))[self.index]
        self.shard = Shard(cfg, plan, [params[i] for i in mine])
        self.clock = [0] * self.dp  # steps of each worker applied
        self.rounds = 0
        self.pending: dict[int, dict[int, torch.Tensor]] = {}  # k=0: step -> worker -> grad
        self.waiting: dict[int, tuple[int, bool, float]] = {}  # worker -> (step, exact, since)
        self.stepped_sq: dict[int, float] = {}  # worker -> |gradient stepped with|^2 (shard)
        self.done: set[int] = set()
        self.started = False
        self.outbox: list[tuple[Any, torch.Tensor]] = []  # sends in flight (never block)
        self.stats: dict[str, Any] = {
            "updates": 0,
            "apply_s": 0.0,
            "staleness": {str(w): {} for w in range(self.dp)},
            "bound_wait_s": [0.0] * self.dp,
        }

    def run(self, run_dir: Path) -> None:
        buf = torch.zeros(HEADER_WORDS + self.shard.numel)
        t0 = time.perf_counter()
        while len(self.done) < self.dp:
            work = self.ps.recv_anysource([buf], 0)
            work.wait()
            self.handle(work._source_rank(), buf.clone())
        wall = time.perf_counter() - t0
        self.stats.update(
            wall_s=wall,
            apply_rate_per_s=self.stats["updates"] / max(self.stats["apply_s"], 1e-9),
            updates_per_s=self.stats["updates"] / max(wall, 1e-9),
            rounds=self.rounds,
            shard_params=self.shard.numel,
        )
        record = RunDir(run_dir).server_record(self.index)
        record.parent.mkdir(exist_ok=True)
        record.write_text(json.dumps(self.stats, indent=2))
        for work, _ in self.outbox:
            work.wait()
        self.ps.send([_message(REPLY, self.rounds, 0, 0, torch.zeros(0))], 0, 0).wait()

    def send(self, msg: torch.Tensor, dst: int) -> None:
        """Non-blocking: a worker waits on every server at once, in any order."""
        self.outbox = [(w, t) for w, t in self.outbox if not w.is_completed()]
        self.outbox.append((self.ps.send([msg], dst, 0), msg))

    def handle(self, src: int, msg: torch.Tensor) -> None:
        kind, step, read, norm, _ = (float(x) for x in msg[:HEADER_WORDS])
        body = msg[HEADER_WORDS:]
        kind_i, step_i = int(kind), int(step)
        if kind_i == INIT:  # worker 0: parameters (and state after a resume) at step_i
            for p, v in zip(self.shard.params, _unflat(body, self.shard.params), strict=True):
                p.data.copy_(v)
            if read > 0:
                state = torch.zeros(self.shard.state_numel)
                self.ps.recv([state], 0, 0).wait()
                self.shard.load_state_flat(state)
            self.clock = [step_i] * self.dp
            self.rounds, self.started = step_i, True
        elif kind_i == PUSH:
            self.push(src, step_i, int(read), norm, body)
            self.waiting[src] = (step_i + 1, False, time.perf_counter())
        elif kind_i in (HELLO, PULL):
            self.waiting[src] = (step_i, kind_i == PULL, time.perf_counter())
        elif kind_i == SNAPSHOT:
            self.send(_message(REPLY, self.rounds, 0, 0, self.shard.state_flat()), src)
        elif kind_i == DONE:
            self.done.add(src)
        self.answer()

    def push(self, w: int, step: int, read: int, norm: float, grad: torch.Tensor) -> None:
        staleness = step - read
        hist = self.stats["staleness"][str(w)]
        hist[str(staleness)] = hist.get(str(staleness), 0) + 1
        clip = self.cfg.optim.grad_clip
        t0 = time.perf_counter()
        if self.k == 0:
            self.pending.setdefault(step, {})[w] = grad
            if len(self.pending[step]) < self.dp:
                return
            grads = self.pending.pop(step)
            total = grads[0].clone()
            for i in range(1, self.dp):  # a fixed order: the same sum on every server
                total += grads[i]
            total /= self.dp
            sq = float(total.double().square().sum())  # the averaged gradient, as DDP's
            self.stepped_sq = dict.fromkeys(range(self.dp), sq)
            if clip > 0:
                total *= self.clip_coef(clip, total)
            self.shard.apply(total, self.plan.lr.lr_at(step))
            self.clock = [step + 1] * self.dp
        else:  # each worker's gradient is a step of its own
            self.stepped_sq[w] = float(grad.double().square().sum())
            if clip > 0:
                grad = grad * min(1.0, clip / (norm + 1e-6))
            self.shard.apply(grad, self.plan.lr.lr_at(step) / self.dp)
            self.clock[w] = step + 1
        self.rounds = min(self.clock)
        self.stats["updates"] += 1
        self.stats["apply_s"] += time.perf_counter() - t0

    def clip_coef(self, clip: float, total: torch.Tensor) -> float:
        """torch's clip_grad_norm_ coefficient over the whole model: the servers' default
        group holds only servers; each adds its shard's square."""
        sq = total.double().square().sum().reshape(1)
        if dist.get_world_size() > 1:
            dist.all_reduce(sq)
        return min(1.0, clip / (float(sq.sqrt()) + 1e-6))

    def answer(self) -> None:
        if not self.started:
            return
        for w, (step, exact, since) in list(self.waiting.items()):
            need = step if exact else step - self.k
            if self.rounds < need:
                continue
            waited = time.perf_counter() - since
            del self.waiting[w]
            if not exact:  # the time this worker was held back by the bound
                self.stats["bound_wait_s"][w] += waited
            body = _flat(self.shard.params)
            reply = _message(
                REPLY,
                self.rounds,
                self.shard.steps_applied,
                waited,
                body,
                self.stepped_sq.get(w, 0),
            )
            self.send(reply, w)


def model_shapes(cfg: DtrainConfig) -> list[torch.Tensor]:
    """The model's trainable parameters, in model order, on the meta device: a server
    allocates only its shard's (:class:`Shard`), never the whole model."""
    from dtrain_cli.models import model_spec
    from dtrain_cli.runtime.parallel.materialize import deferred_build

    model, _ = deferred_build(model_spec(cfg), cfg.train.seed, replayable=False)
    return [p for p in model.parameters() if p.requires_grad]


def serve(cfg: DtrainConfig, plan: Plan, ctx: Any, run_dir: Path) -> dict[str, Any]:
    """A server rank: its shard of the model's parameters (filled in by worker 0's INIT)
    and their optimizer state, then messages until every worker is done."""
    loop = ServerLoop(cfg, plan, ctx.ps, ctx.rank, model_shapes(cfg))
    log.info(
        "server %d: %d parameters of %d tensors",
        loop.index,
        loop.shard.numel,
        len(loop.shard.params),
    )
    loop.run(run_dir)
    return {"role": "server", "updates": loop.stats["updates"]}
