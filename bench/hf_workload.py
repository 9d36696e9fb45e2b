"""The Hugging Face model for the hand-written loops: what a user would write with
transformers alone, on dtrain's sample stream (``--hf-model JSON``, see ``plain_ddp.py``).

    torchrun --standalone --nproc-per-node 2 bench/plain_ddp.py --block-size 128 \
        --vocab-size 256 --hf-model '{"model_type": "llama", "config": {"num_hidden_layers": 4}}'

``AutoModelForCausalLM.from_config`` under the seed dtrain uses, fp32, no KV cache; the loss
is the model's own (``labels=`` with the next tokens as ``shift_labels``), as
``train.loss=model`` does in dtrain.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from loop_common import Workload


class HFWorkload(Workload):
    """:class:`loop_common.Workload` with a transformers causal LM instead of dtrain's GPT
    (same data stream, batch layout and seeding)."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        from dtrain_cli.config.schema import DataConfig
        from dtrain_cli.runtime.data.stream import BatchLayout, SampleStream, open_splits

        self.imported_at = time.time()
        self.args = args
        desc = json.loads(args.hf_model)
        conf = AutoConfig.for_model(desc["model_type"], **desc.get("config", {}))
        data = DataConfig(source=args.data_source, val_fraction=args.val_fraction)
        shape = argparse.Namespace(block_size=args.block_size, vocab_size=conf.vocab_size)
        self.windows = open_splits(data, shape, args.seed)["train"]
        self.stream = SampleStream(len(self.windows), args.seed)
        self.layout = BatchLayout(args.micro_batch, args.grad_accum, world, rank)
        torch.manual_seed(args.seed)
        self.model = AutoModelForCausalLM.from_config(
            conf, attn_implementation=desc.get("attn_implementation", "sdpa"), dtype=torch.float32
        )
        self.model.config.use_cache = False
        self.device = torch.device("cpu")
        if args.device == "cuda":
            self.device = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        self.model.to(self.device)

    def loss(self, model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        x, y = tokens[:, :-1], tokens[:, 1:].contiguous()
        with torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.args.precision == "bf16"
        ):
            return model(input_ids=x, labels=y, shift_labels=y).loss
