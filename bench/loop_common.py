"""The workload every hand-written loop in the benchmark trains, shared so that the plain
torchrun loop and the peers (Lightning Fabric, the Lightning Trainer, accelerate) run the
SAME model class, data, optimizer and schedule as ``dtrain launch``.

The model is ``dtrain_cli.models.gpt.net.GPT`` seeded like dtrain seeds it; the data is the
global sample stream of ``dtrain_cli.runtime.data.stream`` cut into per-rank micro-batches by
``BatchLayout`` (what dtrain's data-parallel ranks read); AdamW with decay only on
matrices, linear warmup then cosine, global-norm clipping. Each program prints one JSON
line on rank 0 (:func:`result_record`) with the time of the timed steps, the time from
``$BENCH_T0`` to the end of step 1, and the final parameter sum.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class Timings:
    torch_imported: float
    dtrain_imported: float = math.nan
    process_group_ready: float = math.nan
    model_ready: float = math.nan
    first_step_done: float = math.nan
    timed_start: float = math.nan
    timed_end: float = math.nan

    def step_done(self, step: int, args: argparse.Namespace, loss: Any, log: bool) -> None:
        """After optimizer step ``step`` (0-based): time stamps, and every ``log_every``
        steps the log line the benchmark watches (``log``: on rank 0)."""
        if step == 0:
            self.first_step_done = time.time()
        if step + 1 == args.timed_from:
            self.timed_start = time.perf_counter()
        if log and (step + 1) % args.log_every == 0:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)


def parse_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    add = p.add_argument
    add("--n-layer", type=int, default=4)
    add("--n-head", type=int, default=4)
    add("--n-embd", type=int, default=128)
    add("--block-size", type=int, default=128)
    add("--vocab-size", type=int, default=256)
    add("--data-source", default="builtin")
    add("--val-fraction", type=float, default=0.1)
    add("--micro-batch", type=int, default=8)
    add("--grad-accum", type=int, default=1)
    add("--steps", type=int, default=60)
    add("--timed-from", type=int, default=10, help="time the steps after this one")
    add("--seed", type=int, default=1337)
    add("--lr", type=float, default=1e-3)
    add("--min-lr", type=float, default=1e-4)
    add("--warmup-steps", type=int, default=10)
    add("--weight-decay", type=float, default=0.1)
    add("--betas", type=float, nargs=2, default=(0.9, 0.95))
    add("--eps", type=float, default=1e-8)
    add("--grad-clip", type=float, default=1.0)
    add("--bucket-mb", type=float, default=25.0)
    add("--threads", type=int, default=1)
    add("--log-every", type=int, default=10)
    add("--nproc", type=int, default=2, help="processes (peers that launch their own)")
    add("--device", default="cpu", choices=("cpu", "cuda"))
    add("--precision", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast")
    add("--compile", action="store_true", help="torch.compile each block, as dtrain does")
    add("--hf-model", default=None, help="JSON {model_type, config}: a transformers model")
    add("--custom-model", default=None, help="JSON {_target_, kwargs, import_roots}: your own")
    add("--profile-steps", type=int, nargs=2, default=None, help="FIRST LAST (1-based)")
    add("--profile-out", default=None, help="a folder: each rank's torch.profiler trace")
    return p.parse_args()


def step_profiler(args: argparse.Namespace, rank: int, device: torch.device) -> Any:
    """``--profile-steps A B --profile-out DIR``: dtrain's own profiler component (a
    torch.profiler trace of steps A..B in ``DIR/profile/rank_<k>.trace.json``), imported
    only then, so that no other run pays for the import; else a stand-in that does nothing."""
    if not (args.profile_steps and args.profile_out):
        return _NoProfiler()
    from dtrain_cli.runtime.components.profiling import Profiler

    return Profiler(list(args.profile_steps), Path(args.profile_out), rank, device)


class _NoProfiler:
    def step_begins(self, step: int) -> None:
        pass

    def step_ends(self, step: int) -> None:
        pass


def lr_factor(step: int, args: argparse.Namespace) -> float:
    """Linear warmup, then cosine from ``lr`` to ``min_lr`` over the remaining steps."""
    if args.warmup_steps and step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
    lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr / args.lr


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=args.lr, betas=tuple(args.betas), eps=args.eps, foreach=True
    )


def make_scheduler(opt: torch.optim.Optimizer, args: argparse.Namespace) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args))


class Workload:
    """The model and this rank's batches. dtrain_cli is imported here (after the process
    group is up, so its import is timed apart from torch's)."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int) -> None:

        from dtrain_cli.config.schema import DataConfig
        from dtrain_cli.models.gpt import GPTConfig as ModelConfig
        from dtrain_cli.models.gpt.net import GPT
        from dtrain_cli.models.losses import cross_entropy as lm_loss
        from dtrain_cli.runtime.data.stream import BatchLayout, SampleStream, open_splits

        self.imported_at = time.time()
        self.args = args
        self.lm_loss = lm_loss
        mcfg = ModelConfig(
            n_layer=args.n_layer,
            n_head=args.n_head,
            n_embd=args.n_embd,
            block_size=args.block_size,
            vocab_size=args.vocab_size,
        )
        data = DataConfig(source=args.data_source, val_fraction=args.val_fraction)
        self.windows = open_splits(data, mcfg, args.seed)["train"]
        self.stream = SampleStream(len(self.windows), args.seed)
        self.layout = BatchLayout(args.micro_batch, args.grad_accum, world, rank)
        torch.manual_seed(args.seed)
        self.model = GPT(mcfg)  # built on the CPU with dtrain's seed, then moved
        self.device = torch.device(args.device, rank % max(1, torch.cuda.device_count()))
        if args.device == "cpu":
            self.device = torch.device("cpu")
        self.model.to(self.device)
        if args.compile:  # per block, like dtrain's train.compile
            for name, block in list(self.model.layers.named_children()):
                self.model.layers.register_module(name, torch.compile(block))

    def batch(self, step: int, micro: int = 0) -> torch.Tensor:
        """This rank's micro-batch ``micro`` of optimizer step ``step``: [B, T+1] tokens."""
        idx = self.stream.indices(self.layout.micro_start(step, micro), self.args.micro_batch)
        tokens = torch.from_numpy(self.windows.gather(idx))
        if self.device.type == "cuda":
            return tokens.pin_memory().to(self.device, non_blocking=True)
        return tokens

    def loss(self, model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        if self.args.precision == "bf16":
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                return self.lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        return self.lm_loss(model(tokens[:, :-1]), tokens[:, 1:])

    def param_sum(self) -> float:
        return float(sum(p.detach().double().sum() for p in self.model.parameters()))


def result_record(
    bench: str, args: argparse.Namespace, times: Timings, world: int, **extra: Any
) -> dict[str, Any]:
    t0 = float(os.environ.get("BENCH_T0", "nan"))
    timed_steps = args.steps - args.timed_from
    timed_s = times.timed_end - times.timed_start
    tokens_per_step = args.micro_batch * args.grad_accum * world * args.block_size
    return {
        "bench": bench,
        "timed_steps": timed_steps,
        "timed_s": timed_s,
        "ms_per_step": 1000 * timed_s / timed_steps,
        "tokens_per_s": tokens_per_step * timed_steps / timed_s,
        "torch_imported_s": times.torch_imported - t0,
        "process_group_ready_s": times.process_group_ready - t0,
        "dtrain_imports_s": times.dtrain_imported - times.process_group_ready,
        "model_ready_s": times.model_ready - t0,
        "first_step_done_s": times.first_step_done - t0,
        **extra,
    }
