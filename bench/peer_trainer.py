"""Peer: the Lightning Trainer, started by its own launcher (``python bench/peer_trainer.py``).

    bench/.venv-peers/bin/python bench/peer_trainer.py --nproc 2 --steps 60 --timed-from 10

The loop of :mod:`plain_ddp` as a ``LightningModule``: ``training_step`` returns the loss,
``configure_optimizers`` the same AdamW and per-step schedule, the Trainer clips by global
norm and runs DDP with the same options. Its best case: no logger, no checkpointing, no
progress bar, no model summary, no validation, no distributed sampler (the batches are
the rank's own, as in the other programs). Same model and data (:mod:`loop_common`).
Runs in the bench environment only (``make bench-peers-env``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy
from loop_common import Timings, Workload, make_optimizer, make_scheduler, parse_args, result_record


class StepBatches(torch.utils.data.Dataset):
    """Item ``i``: this rank's tokens for optimizer step ``i``."""

    def __init__(self, work: Workload) -> None:
        self.work = work

    def __len__(self) -> int:
        return self.work.args.steps

    def __getitem__(self, step: int) -> torch.Tensor:
        return self.work.batch(step)


class Module(LightningModule):
    def __init__(self, args: Any) -> None:
        super().__init__()
        self.args = args
        self.work: Workload | None = None
        self.model: torch.nn.Module | None = None

    def setup(self, stage: str) -> None:  # the process group is up here
        self.work = Workload(self.args, self.global_rank, self.trainer.world_size)
        self.model = self.work.model

    def training_step(self, tokens: torch.Tensor, index: int) -> torch.Tensor:
        return self.work.loss(self.model, tokens)

    def configure_optimizers(self) -> Any:
        opt = make_optimizer(self.model, self.args)
        sched = {"scheduler": make_scheduler(opt, self.args), "interval": "step"}
        return {"optimizer": opt, "lr_scheduler": sched}

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(StepBatches(self.work), batch_size=None)


class Clock(Callback):
    def __init__(self, times: Timings, args: Any) -> None:
        self.times, self.args, self.loss = times, args, torch.zeros(())

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.times.process_group_ready = time.time()  # before the module's setup

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.times.dtrain_imported = pl_module.work.imported_at
        self.times.model_ready = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, index) -> None:
        self.loss = outputs["loss"]
        self.times.step_done(index, self.args, self.loss, log=trainer.global_rank == 0)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.times.timed_end = time.perf_counter()


def wait_for_other_ranks(strategy: object) -> None:
    """As in peer_fabric.py: Lightning's launcher does not wait for the ranks it starts."""
    for proc in getattr(getattr(strategy, "launcher", None), "procs", []):
        proc.wait()


def main() -> None:
    times = Timings(torch_imported=time.time())
    args = parse_args(__doc__.splitlines()[0])
    if args.grad_accum != 1:  # one dataset item per optimizer step
        raise SystemExit("peer_trainer.py: --grad-accum must be 1")
    torch.set_num_threads(args.threads)
    clock = Clock(times, args)
    strategy = DDPStrategy(
        process_group_backend="gloo", bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=args.nproc,
        strategy=strategy,
        max_steps=args.steps,
        accumulate_grad_batches=args.grad_accum,
        gradient_clip_val=args.grad_clip,
        gradient_clip_algorithm="norm",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=False,
        callbacks=[clock],
    )
    module = Module(args)
    trainer.fit(module)
    torch.set_num_threads(args.threads)
    if trainer.global_rank == 0:
        result = {"param_sum": module.work.param_sum(), "final_loss": clock.loss.item()}
        record = result_record("trainer", args, times, trainer.world_size, **result)
        print(json.dumps(record), flush=True)
        wait_for_other_ranks(trainer.strategy)


if __name__ == "__main__":
    main()
