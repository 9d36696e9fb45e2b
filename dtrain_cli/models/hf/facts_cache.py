"""The plan's facts of a Hugging Face model, kept per model config so a launch that has seen
the config before imports neither torch nor transformers for its plan.

    <cache>/hf-facts/<sha256 of the key>.json   # <cache>: data.cache_dir, $DTRAIN_CACHE,
                                                #          ~/.cache/dtrain (as corpora)

A record is what the launcher reads of the transformers config and of the meta-device build
(:func:`.net.meta_counts`): the model type, vocabulary, tied embeddings and the counts, and
the bytes one window's forward saves for backward (:func:`.net.saved_per_sample`). Its key
is everything they depend on: the model options (type, config keywords, local folder's
``config.json`` bytes, attention kernel, ``block_size``), the installed transformers and
torch versions (package metadata, no import) and the source of the code that computes the counts; a
change to any of them is a new key. Only a config that passed every check is recorded, so a
hit skips the checks that need transformers too. Reading or writing the cache never fails a
run: an unreadable record or folder is a miss, a write that fails is skipped.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from dtrain_cli.models.records import files_hash, key_of

FOLDER = "hf-facts"
FORMAT = 4
"""The record's layout; raise it when the record's fields change (2: saved bytes; 3: saved
at 2 bytes a value, under autocast and with bf16 parameters)."""
_COUNTING_CODE = (
    Path(__file__).with_name("net.py"),
    Path(__file__).with_name("tensor_parallel.py"),  # tp_plan, tp_replicated
    Path(__file__).parent.parent / "units.py",
    Path(__file__).parent.parent / "saved_bytes.py",
)
"""What computes the counts (:func:`.net.meta_counts` and the layer lists it reads) and
the bytes saved for backward (:func:`.net.saved_per_sample`)."""


def facts_key(options: dict[str, Any]) -> str | None:
    """The key of a model's record (``options``: the HF model config's fields that the
    transformers config depends on); None when transformers is not importable (the plan
    then says so) or a local folder's config cannot be read."""
    try:
        if importlib.util.find_spec("transformers") is None:
            return None
    except ValueError:  # a stand-in module without a spec (tests): no record
        return None
    return _key(json.dumps(options, sort_keys=True, default=str))


@functools.lru_cache(maxsize=64)
def _key(options_json: str) -> str | None:
    """Once per model config in a process (``dtrain advise`` plans dozens of layouts)."""
    options = json.loads(options_json)
    try:
        versions = [importlib.metadata.version(p) for p in ("transformers", "torch")]
        net = files_hash(_COUNTING_CODE)
        pretrained = options.get("pretrained")
        saved = ""
        if pretrained:
            text = (Path(os.path.expanduser(pretrained)) / "config.json").read_bytes()
            saved = hashlib.sha256(text).hexdigest()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    return key_of([FORMAT, versions, net, saved, options])
