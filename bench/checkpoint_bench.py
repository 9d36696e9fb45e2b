"""Checkpoint benchmark: dtrain's DCP checkpoints (sync and async) against one torch.save.

    .venv/bin/python bench/run.py --only checkpoint

Two gloo ranks hold a DDP-replicated GPT with AdamW state (one optimizer step taken), and
time dtrain's own CheckpointManager (the code path of every run: DCP shards, RNG files,
manifest with sha256, atomic publish):
- sync save: the training loop waits for all of it;
- async save: what the loop waits for (the stall: staging a CPU copy and starting the
  background write), then the total until the checkpoint is published;
- load: DCP read back into a fresh model and optimizer state;
- torch.save: the same state (model + optimizer state dicts) as one file from rank 0.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, Section, Workspace, log, markdown_table

sys.path.insert(0, str(REPO))

MODELS = {
    "gpt_small (14.5M params)": {"n_layer": 8, "n_head": 6, "n_embd": 384, "block_size": 256},
    "synthetic 42M params": {"n_layer": 8, "n_head": 10, "n_embd": 640, "block_size": 256},
}


def _worker(rank: int, port: int, shape: dict, rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dtrain_cli.models.gpt import GPTConfig as ModelConfig
    from dtrain_cli.models.gpt.net import GPT
    from dtrain_cli.models.losses import cross_entropy as lm_loss
    from dtrain_cli.runtime.state.dcp import CheckpointManager

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DDP(GPT(ModelConfig(**shape)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (1, 33))
    lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
    opt.step()
    run_dir = Path(out) / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[float]] = {"sync": [], "stall": [], "async_total": [], "load": []}
    sync_mgr = CheckpointManager(run_dir, rank, keep_last=1, async_save=False)
    async_mgr = CheckpointManager(run_dir, rank, keep_last=1, async_save=True)
    step = 0
    for _ in range(rounds):
        for name, mgr in (("sync", sync_mgr), ("async", async_mgr)):
            step += 1
            model_sd, optim_sd = get_state_dict(model, opt)
            state = {"model": model_sd, "optim": optim_sd}
            dist.barrier()
            t0 = time.perf_counter()
            mgr.save(step, state, {"step": step}, {})
            t1 = time.perf_counter()
            mgr.wait()
            dist.barrier()
            t2 = time.perf_counter()
            if name == "sync":
                results["sync"].append(t2 - t0)
            else:
                results["stall"].append(t1 - t0)
                results["async_total"].append(t2 - t0)
        path = run_dir / "checkpoints" / f"step_{step:06d}"
        model_sd, optim_sd = get_state_dict(model, opt)
        dist.barrier()
        t0 = time.perf_counter()
        sync_mgr.load(path, {"model": model_sd, "optim": optim_sd})
        dist.barrier()
        results["load"].append(time.perf_counter() - t0)
    written = sum(f.stat().st_size for f in path.iterdir())
    if rank == 0:
        single = Path(out) / "single.pt"
        saves = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict()}, single)
            os.sync()
            saves.append(time.perf_counter() - t0)
        results["torch_save"] = saves
        Path(out, "result.json").write_text(
            json.dumps({**results, "bytes": written, "torch_save_bytes": single.stat().st_size})
        )
    async_mgr.close()
    dist.destroy_process_group()


def measure(shape: dict, rounds: int) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp(prefix="dtrain-ckpt-bench-")
    try:
        mp.start_processes(_worker, args=(port, shape, rounds, out), nprocs=2, start_method="spawn")
        return json.loads(Path(out, "result.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _ms(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{1000 * med:,.0f} ms ({1000 * min(values):,.0f}\u2013{1000 * max(values):,.0f})"


def checkpoint_bench(ws: Workspace) -> Section:
    rounds = 2 if ws.quick else 5
    rows = []
    for label, shape in MODELS.items():
        log(f"checkpoint: {label}, {rounds} rounds")
        r = measure(shape, rounds)
        stall_ratio = statistics.median(r["stall"]) / statistics.median(r["sync"])
        rows.append(
            [
                label,
                f"{r['bytes'] / 2**20:,.0f} MiB",
                _ms(r["sync"]),
                _ms(r["stall"]),
                f"{stall_ratio:.0%}",
                _ms(r["async_total"]),
                _ms(r["load"]),
                f"{_ms(r['torch_save'])}, {r['torch_save_bytes'] / 2**20:,.0f} MiB",
            ]
        )
    table = markdown_table(
        [
            "model (AdamW state)",
            "bytes written",
            "sync save",
            "async stall",
            "stall / sync (target <= 10%)",
            "async total",
            "load",
            "one torch.save (rank 0)",
        ],
        rows,
    )
    return Section(
        "Checkpoints: sync, async, load, vs one torch.save",
        "Two gloo ranks, DDP-replicated GPT + AdamW state after one step, dtrain's "
        "CheckpointManager (DCP shards written by both ranks, RNG files, sha256 manifest, "
        f"atomic publish). Medians (min\u2013max) of {rounds} rounds. The async stall is "
        "what the training loop waits for; the rest is written in the background.",
        table,
        commands=[".venv/bin/python bench/run.py --only checkpoint"],
    )
