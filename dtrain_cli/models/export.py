"""Writing a trained, plain (non-distributed) model: one ``safetensors`` file and the model
config next to it (``<out>.json``), for every model kind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn


def save_safetensors(model: nn.Module, out: Path, model_config: dict[str, Any]) -> list[Path]:
    from safetensors.torch import save_model

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    save_model(model, str(tmp))
    os.chmod(tmp, 0o644)  # a model file is for reading by others (the default was 0600)
    os.replace(tmp, out)
    config_path = out.with_suffix(".json")
    config_path.write_text(json.dumps({"model": model_config}, indent=2))
    return [out, config_path]
