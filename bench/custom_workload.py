"""A model of the user's own for the hand-written loop: the class a ``model=custom`` run
names (``--custom-model JSON``, see ``plain_ddp.py``), on dtrain's token sample stream.

    torchrun --standalone --nproc-per-node 2 bench/plain_ddp.py --block-size 128 \
        --custom-model '{"_target_": "own_lm.OwnLM", "kwargs": {"width": 128}, \
                         "import_roots": ["bench/own_model"]}'

The class is imported from the run's ``import_roots`` (as dtrain's workers import it) and
built with its keyword arguments under the seed dtrain uses; the loss is next-token cross
entropy on its outputs, as ``train.loss=auto`` gives a custom model on token data.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import torch
from loop_common import Workload


class CustomWorkload(Workload):
    """:class:`loop_common.Workload` with the user's own class instead of dtrain's GPT
    (same data stream, batch layout, seeding and loss)."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int) -> None:
        from dtrain_cli.config.schema import DataConfig
        from dtrain_cli.models.losses import cross_entropy as lm_loss
        from dtrain_cli.runtime.data.stream import BatchLayout, SampleStream, open_splits

        self.imported_at = time.time()
        self.args = args
        self.lm_loss = lm_loss
        desc = json.loads(args.custom_model)
        kwargs = desc.get("kwargs", {})
        sys.path[:0] = [p for p in desc.get("import_roots", []) if p not in sys.path]
        module, _, name = desc["_target_"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        data = DataConfig(source=args.data_source, val_fraction=args.val_fraction)
        if args.compile:
            raise SystemExit("plain_ddp.py --custom-model does not compile; run without --compile")
        vocab = kwargs.get("vocab_size")  # as dtrain reads it: the argument, if given
        shape = argparse.Namespace(block_size=args.block_size, vocab_size=vocab)
        self.windows = open_splits(data, shape, args.seed)["train"]
        self.stream = SampleStream(len(self.windows), args.seed)
        self.layout = BatchLayout(args.micro_batch, args.grad_accum, world, rank)
        torch.manual_seed(args.seed)
        self.model = cls(**kwargs)
        self.device = torch.device("cpu")
        if args.device == "cuda":
            self.device = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        self.model.to(self.device)
