"""The workers' side of the parameter server (:mod:`.param_server`): the optimizer step
becomes push the gradient, pull the parameters.

    dtrain launch recipe=gpt_tiny dp=2 sync.mode=param_server sync.max_staleness=1

Every push and pull to all servers is posted at once (``isend``/``irecv`` on ``ctx.ps``)
and then waited for, so no server's reply waits behind another's. Per logging window the
workers reduce (over their own default group) each worker's staleness histogram, the time
the bound held it back, and its tokens/s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.runtime.sync.base import SyncRuntime
from dtrain_cli.runtime.sync.param_server import (
    DONE,
    HELLO,
    INIT,
    PULL,
    PUSH,
    SNAPSHOT,
    _flat,
    _message,
    _unflat,
)
from dtrain_cli.sync_modes.param_server import HEADER_WORDS, assign_shards, optim_slots


class ParamServerClient:
    def __init__(
        self, cfg: DtrainConfig, plan: Plan, ps: Any, rank: int, params: list[nn.Parameter]
    ) -> None:
        assert plan.sync is not None
        self.ps, self.rank, self.params = ps, rank, params
        self.dp, self.k = plan.batch.dp, plan.sync.max_staleness
        self.tokens_per_step = plan.batch.tokens_per_step / plan.batch.dp
        self.server_ranks = [s.rank for s in plan.sync.servers]
        self.shards = assign_shards([p.numel() for p in params], len(self.server_ranks))
        self.shard_params = [[params[i] for i in idx] for idx in self.shards]
        slots = len(optim_slots(cfg))
        self.state_numel = [slots * sum(p.numel() for p in sp) + 1 for sp in self.shard_params]
        self.read = 0  # rounds of all workers in the parameters this worker holds
        self.bytes = {"sent": 0, "received": 0}
        self.totals: dict[int, int] = {}
        self.wait_total = 0.0
        self._window()
        self.restored: list[torch.Tensor] | None = None

    def _window(self) -> None:
        self.hist: dict[int, int] = {}
        self.wait_s = 0.0
        self.steps = 0
        self.window_start = time.perf_counter()

    # -- checkpoint ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Rank 0 holds the servers' optimizer state in the checkpoint (DCP, keys of its own);
        the parameters are the model's (every worker pulled the latest before a save)."""
        if self.rank != 0:
            return {}
        flats = self.restored or [torch.zeros(n) for n in self.state_numel]
        return {f"shard_{i}": flat for i, flat in enumerate(flats)}

    def pull_latest(self, step: int) -> None:
        """Parameters with every worker's steps < ``step`` applied (all workers are there)."""
        self._exchange(PULL, step, 0.0, None)
        self.read = step

    def before_save(self, step: int) -> dict[str, Any]:
        """Every worker pulls parameters with all steps < ``step`` applied; rank 0 also the
        servers' optimizer state."""
        self.pull_latest(step)
        if self.rank != 0:
            return {}
        flats = []
        for i, dst in enumerate(self.server_ranks):
            self._send(i, _message(SNAPSHOT, step, 0, 0, torch.zeros(0)))
            buf = torch.zeros(HEADER_WORDS + self.state_numel[i])
            self.ps.recv([buf], dst, 0).wait()
            flats.append(buf[HEADER_WORDS:].clone())
        return {f"shard_{i}": flat for i, flat in enumerate(flats)}

    # -- the step ----------------------------------------------------------------------------
    def start(self, step: int, server_state: dict[str, Any] | None) -> None:
        """Rank 0 seeds the servers (its parameters, and their optimizer state after a
        resume); every worker then pulls the step's parameters."""
        if self.rank == 0:
            for i, dst in enumerate(self.server_ranks):
                has_state = 1.0 if server_state else 0.0
                body = _flat(self.shard_params[i])
                self.ps.send([_message(INIT, step, has_state, 0, body)], dst, 0).wait()
                if server_state:
                    self.ps.send([server_state[f"shard_{i}"].float()], dst, 0).wait()
        self._exchange(HELLO, step, 0.0, None)
        self.read = step

    def step(self, step: int, clip: float) -> torch.Tensor:
        """Push this step's gradient (computed on parameters ``self.read`` rounds old),
        pull the next step's parameters. Returns the norm (before clipping) of the gradient
        the servers stepped with: the workers' average at max_staleness=0 (as DDP's
        grad_norm), this worker's own gradient otherwise (each push is a step)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        staleness = step - self.read
        self.hist[staleness] = self.hist.get(staleness, 0) + 1
        self.totals[staleness] = self.totals.get(staleness, 0) + 1
        gs = [_flat([grads[i] for i in idx]) for idx in self.shards]
        stepped_sq = self._exchange(PUSH, step, float(norm), gs)
        self.steps += 1
        return torch.tensor(stepped_sq, dtype=torch.float64).sqrt().float()

    def _exchange(
        self, kind: int, step: int, norm: float, bodies: list[torch.Tensor] | None
    ) -> float:
        """Send to every server, take every reply; the sum of the replies' squared norms."""
        sends, recvs, bufs = [], [], []
        for i, dst in enumerate(self.server_ranks):
            body = bodies[i] if bodies is not None else torch.zeros(0)
            if kind == PUSH:
                msg = _message(kind, step, self.read, norm, body)
            else:
                msg = _message(kind, step, 0, 0, torch.zeros(0))
            msg = self._padded(i, msg)
            sends.append((self.ps.send([msg], dst, 0), msg))
            if kind == PUSH:  # per step: the push and its reply (not start-up / saves)
                self.bytes["sent"] += 4 * msg.numel()
            buf = torch.zeros(HEADER_WORDS + self._numel(i))
            recvs.append(self.ps.recv([buf], dst, 0))
            bufs.append(buf)
        t0 = time.perf_counter()
        for work, _ in sends:
            work.wait()
        for work in recvs:
            work.wait()
        held = time.perf_counter() - t0
        rounds = []
        with torch.no_grad():
            for i, buf in enumerate(bufs):
                rounds.append(int(buf[1]))
                for p, v in zip(
                    self.shard_params[i],
                    _unflat(buf[HEADER_WORDS:], self.shard_params[i]),
                    strict=True,
                ):
                    p.copy_(v)
                if kind == PUSH:
                    self.bytes["received"] += 4 * buf.numel()
        self.read = min(rounds)
        if kind == PUSH:
            waited = max(float(b[3]) for b in bufs)
            self.wait_s += min(waited, held)
            self.wait_total += min(waited, held)
        return sum(float(b[4]) for b in bufs)

    def _padded(self, i: int, msg: torch.Tensor) -> torch.Tensor:
        """Every message to server ``i`` has its one size (gloo matches sizes exactly)."""
        return torch.cat([msg, torch.zeros(HEADER_WORDS + self._numel(i) - msg.numel())])

    def _send(self, i: int, msg: torch.Tensor) -> None:
        self.ps.send([self._padded(i, msg)], self.server_ranks[i], 0).wait()

    def _numel(self, i: int) -> int:
        return sum(p.numel() for p in self.shard_params[i])

    # -- observability -------------------------------------------------------------------------
    def log_window(self) -> dict[str, Any]:
        """One all-reduce among the workers: per worker the staleness histogram of this
        window (0..k), the seconds the bound held it back, its tokens/s."""
        width = self.k + 1
        row = torch.zeros(self.dp, width + 2, dtype=torch.float64)
        for s, n in self.hist.items():
            row[self.rank, min(s, width - 1)] += n
        elapsed = time.perf_counter() - self.window_start
        row[self.rank, width] = self.wait_s
        row[self.rank, width + 1] = self.tokens_per_step * self.steps / max(elapsed, 1e-9)
        dist.all_reduce(row)
        self._window()
        hist = row[:, :width].long().tolist()
        return {
            "staleness_hist": {str(w): h for w, h in enumerate(hist)},
            "staleness_max": max((s for h in hist for s, n in enumerate(h) if n), default=0),
            "bound_wait_s": [round(x, 4) for x in row[:, width].tolist()],
            "tokens_per_s_per_worker": [round(x, 1) for x in row[:, width + 1].tolist()],
        }

    def close(self, step: int, run_dir: Path) -> dict[str, Any]:
        """Every worker ends with the final parameters; the servers write their stats
        (servers/server_<i>.json) and rank 0 reads them into the summary."""
        self.pull_latest(step)
        for i in range(len(self.server_ranks)):
            self._send(i, _message(DONE, step, 0, 0, torch.zeros(0)))
        wait = torch.zeros(self.dp, dtype=torch.float64)
        wait[self.rank] = self.wait_total
        dist.all_reduce(wait)
        out: dict[str, Any] = {
            "bound_wait_s_per_worker": [round(x, 4) for x in wait.tolist()],
            "bytes_per_step_measured": {k: v // max(1, step) for k, v in self.bytes.items()},
        }
        if self.rank != 0:
            return out
        for dst in self.server_ranks:
            buf = torch.zeros(HEADER_WORDS)
            self.ps.recv([buf], dst, 0).wait()
        servers = [
            json.loads(RunDir(run_dir).server_record(i).read_text())
            for i in range(len(self.server_ranks))
        ]
        out["servers"] = servers
        out["staleness_hist_applied"] = servers[0]["staleness"]  # every push reaches each
        out["server_apply_rate_per_s"] = [round(s["apply_rate_per_s"], 2) for s in servers]
        return out


class ParamServerSync(SyncRuntime):
    """The parameter server as the loop's sync seam (workers): the optimizer step is push
    the gradient / pull the parameters; the servers' optimizer state in checkpoints."""

    replaces_optimizer_step = True

    @property
    def replicas_step_alone(self) -> bool:  # type: ignore[override]
        """With staleness each push is a step of its own; at 0 the servers average."""
        return bool(self.plan.sync and self.plan.sync.max_staleness > 0)

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        params = [p for _, p in self.trainable()]
        self.client = ParamServerClient(self.cfg, self.plan, self.ctx.ps, self.ctx.rank, params)
        self.snapshot: dict[str, Any] = {}
        self.started = self.finished = False

    def start(self, step: int, server_state: dict[str, Any] | None = None) -> None:
        """Seed the servers and pull (once; after a resume, from the checkpoint)."""
        if not self.started:
            self.client.start(step, server_state)
            self.started = True

    def state(self) -> dict[str, Any]:
        return self.snapshot or self.client.state()

    def on_resume(self, state: dict[str, Any], step: int) -> None:
        self.start(step, state if self.ctx.rank == 0 else None)

    def before_save(self, step: int) -> None:
        self.snapshot = self.client.before_save(step)

    def before_validate(self, step: int) -> None:
        self.client.pull_latest(step)  # every worker validates the same, latest parameters

    def optimizer_step(self, step: int) -> torch.Tensor:
        return self.client.step(step, self.cfg.optim.grad_clip)

    def log_window(self) -> dict[str, Any] | None:
        return self.client.log_window()

    def finish(self, step: int, run_dir: Path) -> dict[str, Any]:
        if self.finished:
            return {}
        self.finished = True
        out: dict[str, Any] = {"param_server": self.client.close(step, run_dir)}
        if self.plan.sync is not None:
            out["bytes_per_step_per_role_estimate"] = self.plan.sync.bytes_per_step
        return out
