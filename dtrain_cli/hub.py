"""What to do with a Hugging Face Hub id where dtrain reads a local folder or file
(``model.pretrained=gpt2``, ``data.path=wikitext``, ``data.tokenizer=meta-llama/...``).

dtrain reads models, tokenizers and datasets from local paths only: every rank of every
node reads the same files, none downloads at start-up. The Hub's own command
(``hf download``, from huggingface_hub) fetches a repository into a folder once, on the
shared filesystem. Torch-free, standard library only.
"""

from __future__ import annotations

import re

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_FILE_SUFFIXES = (".json", ".jsonl", ".txt", ".parquet", ".bin", ".csv", ".arrow", ".yaml")


def looks_like_hub_id(value: str) -> bool:
    """``gpt2``, ``meta-llama/Llama-3.2-1B``: a name or ``owner/name``, not a path that
    starts with ``.``, ``/`` or ``~`` nor a file name with a data suffix."""
    return bool(_HUB_ID.match(value)) and not value.lower().endswith(_FILE_SUFFIXES)


def download_hint(key: str, value: str, *, dataset: bool = False) -> str:
    """``; dtrain reads local files ...: `hf download gpt2 --local-dir models/gpt2`, then
    model.pretrained=models/gpt2`` where ``value`` looks like a Hub id; else ""."""
    if not looks_like_hub_id(value):
        return ""
    name = value.rsplit("/", 1)[-1]
    folder = f"data/{name}" if dataset else f"models/{name}"
    kind = " --repo-type dataset" if dataset else ""
    split = " (or the folder of one split's files in it)" if dataset else ""
    return (
        "; dtrain reads local files (no rank downloads): for a Hugging Face Hub id, fetch "
        f"it once with `hf download {value}{kind} --local-dir {folder}`, then "
        f"{key}={folder}{split}"
    )
