"""``dtrain advise ... --simulate``: the advisor's top layouts, each checked by one simulated
rank (rank 0, one step, ``dtrain simulate``'s fake process group).

    dtrain advise recipe=gpt_1b hardware=h100_80g parallel.nnodes=64 --simulate

Per layout: whether rank 0's start-up and step ran at that scale, and its measured bytes
(parameters, gradients, optimizer state, activations, dp bytes per step) against the plan's,
as the largest measured / plan ratio; a failure (``FAILED:``), or a layout the simulator
cannot run (``not simulated:``), is the one line ``dtrain simulate`` prints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

CHECKED = 3
"""How many of the ranked layouts are simulated."""


def simulate_top(
    advice: Any, kept: list[str], config_dir: list[Path], count: int = CHECKED
) -> list[dict[str, Any]]:
    """``{layout, ok, status, worst, result}`` for the first ``count`` ranked layouts;
    status: ran, failed, or not simulated (the simulator cannot run that layout here)."""
    from dtrain_cli.cli.simulate_cmd import (
        NotSimulated,
        SimulateFailed,
        check_layout,
        simulate_layout,
    )

    out = []
    for verdict in advice.ranked[:count]:
        layout = verdict.layout
        ovs = [*kept, *layout.overrides(advice.nnodes)]
        try:
            doc = simulate_layout(check_layout(ovs, config_dir, "0"), (1, 1), None)
        except SimulateFailed as exc:
            status = "not simulated" if isinstance(exc, NotSimulated) else "failed"
            out.append(
                {"layout": layout.label(), "ok": False, "status": status, "result": exc.lines[0]}
            )
            continue
        what, ratio = worst_ratio(doc["ranks"][0]["bytes"])
        result = f"ran; measured/plan within {ratio:.2f}x ({what})" if what else "ran"
        out.append(
            {
                "layout": layout.label(),
                "ok": True,
                "status": "ran",
                "worst": ratio,
                "result": result,
            }
        )
    return out


def worst_ratio(rows: dict[str, dict[str, Any]]) -> tuple[str, float]:
    """The row whose measured / plan ratio is furthest from 1 (("", 1.0) if none)."""
    known = [(k, r["ratio"]) for k, r in rows.items() if r.get("ratio")]
    if not known:
        return "", 1.0
    return max(known, key=lambda kr: abs(math.log(kr[1])))


def render(checked: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="simulated: rank 0, one step, fake process group", title_justify="left")
    for col in ("layout", "simulated"):
        table.add_column(col)
    for c in checked:
        shown = c["result"] if c["ok"] else f"{c['status'].upper()}: {c['result']}"
        table.add_row(c["layout"], shown)
    return table
