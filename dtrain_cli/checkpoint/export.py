"""Consolidate a sharded DCP checkpoint into one ``safetensors`` file for plain PyTorch.

    dtrain export --ckpt runs/<run>/checkpoints/step_000200 --out model.safetensors

Loads the model entries of the checkpoint into a plain, non-distributed GPT (DCP reads
all shards, whatever layout wrote them), then writes them with ``safetensors`` plus a
JSON file with the model config::

    from safetensors.torch import load_model
    model = GPT(ModelConfig(**json.load(open("model.json"))["model"]))
    load_model(model, "model.safetensors")
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict
from pathlib import Path


def export_safetensors(ckpt: Path, out: Path) -> tuple[Path, Path]:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_model

    from dtrain_cli.checkpoint.catalog import CheckpointError, read_meta
    from dtrain_cli.config.compose import config_from_yaml
    from dtrain_cli.runtime.model import GPT
    from dtrain_cli.runtime.safe_load import SafeLoadPlanner

    cfg = config_from_yaml(ckpt / "config.yaml")
    model = GPT(cfg.model)
    state = {"model": model.state_dict()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "assuming ... one process": yes
            dcp.load(
                state,
                storage_reader=dcp.FileSystemReader(str(ckpt)),
                planner=SafeLoadPlanner(),
                no_dist=True,
            )
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise CheckpointError(f"{ckpt}: cannot be read ({str(exc).splitlines()[0][:300]})") from exc
    model.load_state_dict(state["model"])
    tmp = out.with_name(f".{out.name}.tmp")
    save_model(model, str(tmp), metadata={"step": str(read_meta(ckpt).get("step", ""))})
    os.replace(tmp, out)
    config_path = out.with_suffix(".json")
    config_path.write_text(
        json.dumps(
            {"model": asdict(cfg.model), "source": str(ckpt), "step": read_meta(ckpt).get("step")},
            indent=2,
        )
    )
    return out, config_path
