"""Consolidate a sharded DCP checkpoint into a plain model file for use outside dtrain.

    dtrain export --ckpt runs/<run>/checkpoints/step_000200 --out model.safetensors
    dtrain export --ckpt runs/<run> --format hf --out exported/      # Hugging Face models

Builds the model the run trained through its spec (:mod:`dtrain_cli.models`), loads the
checkpoint's model entries into it (DCP reads all shards, whatever layout wrote them), and
lets the spec write it: one ``safetensors`` file plus ``<out>.json`` with the model config
for every kind; ``save_pretrained`` for ``--format hf``. Reading it back::

    from safetensors.torch import load_model
    from dtrain_cli.models.gpt import GPTConfig
    from dtrain_cli.models.gpt.net import GPT
    model = GPT(GPTConfig(**json.load(open("model.json"))["model"]))
    load_model(model, "model.safetensors")
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

FORMATS = ("safetensors", "hf")


def export_model(ckpt: Path, out: Path, fmt: str = "safetensors") -> list[Path]:
    import torch
    import torch.distributed.checkpoint as dcp

    from dtrain_cli.checkpoint.catalog import CheckpointError, read_meta
    from dtrain_cli.checkpoint.safe_load import SafeLoadPlanner
    from dtrain_cli.config.compose import config_from_yaml
    from dtrain_cli.models import model_spec

    cfg = config_from_yaml(ckpt / "config.yaml")
    spec = model_spec(cfg)
    model = spec.build("cpu")
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
    with torch.no_grad():
        files = spec.export(model, out, fmt)
    for path in files:  # say where the weights came from next to the model config
        if path.suffix == ".json" and path.name != "config.json":
            info = json.loads(path.read_text())
            info.update(source=str(ckpt), step=read_meta(ckpt).get("step"))
            path.write_text(json.dumps(info, indent=2))
    if fmt == "hf" and cfg.data.source == "hf" and cfg.data.tokenizer:  # not annotated: a
        files += with_tokenizer(Path(cfg.data.tokenizer).expanduser(), out)  # key breaks it
    return files


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
)


def with_tokenizer(folder: Path, out: Path) -> list[Path]:
    """The run's tokenizer (``data.tokenizer``) beside an hf export, so ``from_pretrained``
    of the one folder gives both; and the config's and generation config's ``eos_token_id``
    set to its end-of-text token, which ended every training record (the recipe's id was
    another token of this tokenizer, and ``generate`` stopped on it). A folder that is gone
    is skipped with the model still exported."""
    import shutil

    from dtrain_cli.corpus.hf import load_tokenizer

    if not folder.is_dir():
        return []
    copied = []
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, out / name)
            copied.append(out / name)
    eos = load_tokenizer(str(folder)).eos_id
    for name in ("config.json", "generation_config.json") if eos is not None else ():
        path = out / name
        if path.is_file():
            info = json.loads(path.read_text())
            info["eos_token_id"] = eos
            path.write_text(json.dumps(info, indent=2))
    return copied
