"""A simulation's results next to the plan: rows, the rich table, the sweep's plot. Torch-free.

    dtrain simulate recipe=gpt_1b dp=64 tp=8 pp=2 --json

Each rank's measured bytes (parameters, gradients, optimizer state, activations kept per
micro-batch, bytes it sent over dp in one step) beside the plan's estimate for that rank
(the plan's figures are made for the pp rank holding the most parameters: a lighter
pipeline stage's are scaled by its share of them; activations for this rank's own
pipeline stages) and, for
parameters, the exact count of this rank's shard (:mod:`.expect`); ratio = measured /
estimate. A parameter server's rank: its shard, gradient, optimizer state and replies
against the plan's figures for that server (:func:`compare_server`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtrain_cli.plan.plan import Plan
from dtrain_cli.plan.render import bytes_text

MIB = 1024**2
DP_AXES = ("dp", "dp_replicate", "dp_shard", "ps")
"""Axes whose traffic is dp traffic (hsdp splits dp into replicas of shard groups; a
parameter server's workers push their gradients on ``ps``)."""


def compare(
    plan: Plan,
    result: dict[str, Any],
    exact_params: int,
    stage_share: float = 1.0,
    allocated: int | None = None,
) -> dict[str, Any]:
    """One rank's measured / planned figures (what ``--json`` prints per rank).
    ``stage_share``: this rank's pipeline stage's parameters against the stage holding the
    most, for which the plan's parameter-sized figures are made (:func:`.stage_share`).
    ``allocated``: the elements its padded shards take (:class:`.expect.RankCount`;
    ``exact_params`` when nothing is padded)."""
    est = plan.estimates

    def mine(estimate: int) -> int:
        return round(estimate * stage_share)

    every = plan.sync.every if plan.sync is not None else 1
    pairs = {
        "params": (result["params_bytes"], mine(est.bytes_params)),
        "grads": (result["grads_bytes"], mine(est.bytes_grads)),
        "optimizer": (result["optimizer_bytes"], mine(est.bytes_optimizer)),
        "activations": (result["activation_bytes"], stage_activations(plan, result["coords"])),
        "dp_bytes_per_step": (_dp_sent(result), mine(est.comm_bytes_per_step) * every),
    }
    note = None
    if every > 1:  # local SGD, DiLoCo: the simulated rank syncs at its last step
        note = (
            f"one sync: the plan's {bytes_text(est.comm_bytes_per_step)} a step x {every} steps; "
            "measured at the last step, which syncs"
        )
    doc = _rank_doc(result, pairs, exact_params, result.get("dp_note") or note, allocated)
    if doc["params_count"] < doc["params_allocated"]:  # its optimizer state is unpadded
        doc["bytes"]["optimizer"]["note"] = (
            f"for its {doc['params_count']:,} params; the plan's: the fullest rank's"
        )
    return doc


def compare_server(plan: Plan, result: dict[str, Any], exact_params: int) -> dict[str, Any]:
    """A parameter server's rank: its shard, the gradient it steps with, its optimizer
    state and the replies it sends each step, next to the plan's figures for that server
    (an even share of the parameters; whole tensors at run time, the exact count)."""
    srv = plan.sync.server_of(result["rank"]) if plan.sync is not None else None
    assert plan.sync is not None and srv is not None
    pairs = {
        "params": (result["params_bytes"], 4 * srv.params),
        "grads": (result["grads_bytes"], 4 * srv.params),
        "optimizer": (result["optimizer_bytes"], srv.optimizer_bytes),
        "dp_bytes_per_step": (_dp_sent(result), plan.sync.bytes_per_step["server"]["sent"]),
    }
    return _rank_doc(result, pairs, exact_params, "replies to the workers (ps)")


def _dp_sent(result: dict[str, Any]) -> int:
    return sum(c["bytes_sent"] for c in result["collectives"] if c["axis"] in DP_AXES)


def _rank_doc(
    result: dict[str, Any],
    pairs: dict[str, tuple[int, int]],
    exact_params: int,
    dp_note: str | None,
    allocated: int | None = None,
) -> dict[str, Any]:
    """(measured, estimate) pairs as rows with their ratio, and the rank's own facts. The
    parameters' exact bytes are those of the storages they need (``allocated``)."""
    allocated = exact_params if allocated is None else allocated
    rows: dict[str, dict[str, Any]] = {
        k: {"measured": m, "estimate": e, "ratio": round(m / e, 3) if e else None}
        for k, (m, e) in pairs.items()
    }
    rows["params"]["exact"] = 4 * allocated
    if dp_note:
        rows["dp_bytes_per_step"]["note"] = dp_note
    return {
        "rank": result["rank"],
        "coords": result["coords"],
        "compute": result["compute"],
        "params_count": result["params_count"],
        "params_count_exact": exact_params,
        "params_allocated": allocated,
        "wall_s": result["wall_s"],
        "bytes": rows,
        "collectives": result["collectives"],
    }


def stage_activations(plan: Plan, coords: dict[str, int]) -> int:
    """The plan's activations kept per micro-batch on a rank at ``coords``: its pp rank's
    stages (the first stage keeps no logits, the last does), else the whole model's."""
    pipe = plan.pipeline
    if pipe is None or not pipe.stages:
        return plan.estimates.bytes_activations
    pp_rank = coords.get("pp", 0)
    return sum(st.activation_bytes for st in pipe.stages if st.pp_rank == pp_rank)


def render(plan: Plan, ranks: list[dict[str, Any]], title: str) -> Any:
    """The rich table: one block of rows per rank."""
    from rich.markup import escape
    from rich.table import Table

    from dtrain_cli.plan.render import bytes_text

    table = Table(title=title, title_justify="left")
    for col in ("rank (pp,dp,tp)", "what", "measured", "plan", "ratio", "note"):
        table.add_column(col, justify="right" if col in ("measured", "plan", "ratio") else "left")
    for r in ranks:
        c = r["coords"]
        who = f"{r['rank']} ({c.get('pp', 0)},{c.get('dp', 0)},{c.get('tp', 0)})"
        if "server" in c:
            who = f"{r['rank']} (server {c['server']})"
        for what, row in r["bytes"].items():
            note = row.get("note", "")
            if what == "params":
                same = r["params_count"] == r["params_count_exact"]
                note = f"{r['params_count']:,} params; shard {'=' if same else '!='} exact count"
                if r["params_count"] < r.get("params_allocated", 0):
                    note = f"{r['params_count']:,} params, padded to {r['params_allocated']:,}"
                    note += f"; shard {'=' if same else '!='} exact count"
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
            sizes = bytes_text(row["measured"]), bytes_text(row["estimate"])
            table.add_row(who, what, *sizes, ratio, note)
            who = ""
        ops = ", ".join(f"{x['op']}[{x['axis']}] x{x['count']}" for x in r["collectives"])
        # escaped: "all_gather[dp]" is not rich markup
        table.add_row("", "collectives", "", "", "", escape(ops) or "none", end_section=True)
    return table


def sweep_table(labels: list[str], points: list[dict[str, Any]]) -> Any:
    """The sweep in one table: per value, the first rank simulated's parameters, gradients
    and optimizer state and the bytes it sends over dp in a step, measured beside the plan
    (what the plot draws)."""
    from rich.table import Table

    from dtrain_cli.plan.render import bytes_text

    table = Table(title="sweep: the first rank simulated, per value", title_justify="left")
    heads = ("value", "world", "params+grads+optim", "plan", "ratio", "dp bytes/step", "plan")
    for col in (*heads, "ratio", "plan's peak / device"):
        table.add_column(col, justify="left" if col == "value" else "right")
    for label, p in zip(labels, points, strict=True):
        row = [label, f"{p['world_size']:,}"]
        for what in ("memory", "dp_bytes"):
            measured, estimate = p[f"{what}_measured"], p[f"{what}_estimate"]
            ratio = f"{measured / estimate:.2f}" if estimate else "-"
            row += [bytes_text(measured), bytes_text(estimate), ratio]
        table.add_row(*row, _fits_text(p["peak"]))
    return table


def _fits_text(peak: dict[str, Any]) -> str:
    """ "61.2 GiB of 78.0 GiB", "243 GiB of 78.0 GiB: above" (the hardware profile's
    memory; where it names none, the peak alone)."""
    from dtrain_cli.plan.render import bytes_text

    said = bytes_text(peak["estimate"])
    if peak["capacity"] <= 0:
        return said
    above = ": above" if peak["estimate"] > peak["capacity"] else ""
    return f"{said} of {bytes_text(peak['capacity'])}{above}"


def plot_sweep(points: list[dict[str, Any]], out: Path) -> Path:
    """Per-rank memory and bytes sent per step against world size (measured and plan)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    worlds = [p["world_size"] for p in points]
    for key, label in (("memory", "memory per rank"), ("dp_bytes", "dp bytes per step")):
        ax = ax1 if key == "memory" else ax2
        ax.plot(worlds, [p[f"{key}_measured"] / MIB for p in points], "o-", label="measured")
        ax.plot(worlds, [p[f"{key}_estimate"] / MIB for p in points], "s--", label="plan")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("world size")
        ax.set_ylabel(f"{label} (MiB)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def sweep_point(plan: Plan, rank: dict[str, Any], peak: dict[str, Any]) -> dict[str, Any]:
    """A sweep's figures for one world size (rank 0's memory without activations) and the
    plan's peak per device against the hardware profile's memory (``peak``: estimate,
    capacity)."""
    b = rank["bytes"]
    held = ("params", "grads", "optimizer")
    return {
        "world_size": plan.world_size,
        "peak": peak,
        "memory_measured": sum(b[k]["measured"] for k in held),
        "memory_estimate": sum(b[k]["estimate"] for k in held),
        "dp_bytes_measured": b["dp_bytes_per_step"]["measured"],
        "dp_bytes_estimate": b["dp_bytes_per_step"]["estimate"],
    }
