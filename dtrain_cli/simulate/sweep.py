"""A sweep: one override with comma values (``dp=8,64,512``) -> one run per value. Torch-free.

dtrain simulate recipe=gpt_1b parallel.strategy=fsdp dp=8,64,512,4096 --ranks 0
"""

from __future__ import annotations

SWEEP_KEYS = ("dp", "tp", "pp", "parallel.dp", "parallel.tp", "parallel.pp", "parallel.nnodes")


def split_sweep(overrides: list[str]) -> list[tuple[str, list[str]]] | str:
    """[(label, overrides)] per value; a string: why the sweep cannot run."""
    swept = [
        i
        for i, o in enumerate(overrides)
        if "=" in o and "," in o.split("=", 1)[1] and o.split("=", 1)[0] in SWEEP_KEYS
    ]
    if not swept:
        return [("", list(overrides))]
    if len(swept) > 1:
        keys = ", ".join(overrides[i].split("=", 1)[0] for i in swept)
        return f"{keys}: a sweep takes comma values on one key only"
    i = swept[0]
    key, values = overrides[i].split("=", 1)
    runs = []
    for v in values.split(","):
        runs.append((f"{key}={v}", [*overrides[:i], f"{key}={v}", *overrides[i + 1 :]]))
    return runs
