"""``dtrain advise`` on screen: the ranked layouts and why the others were rejected."""

from __future__ import annotations

from collections import Counter

from rich.console import Group
from rich.table import Table

from dtrain_cli.plan.advise import Advice
from dtrain_cli.plan.steptime import GIB

REJECTED_EXAMPLES = 8


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


def render_advice(advice: Advice, top: int) -> Group:
    unit = advice.unit
    title = (
        f"{advice.world_size} x {advice.hardware} ({advice.nnodes} node(s)): "
        f"{len(advice.ranked)} layouts fit, {len(advice.rejected)} rejected; memory in GiB "
        f"per device"
    )
    t = Table(title=title, title_justify="left")
    for col in (
        "#",
        "layout",
        "param+grad+optim",
        "activ+temp",
        "total/capacity",
        "bubble",
        "MiB/step per link",
        "step",
        f"{unit}/s",
        "MFU",
    ):
        t.add_column(col, overflow="fold")
    for i, v in enumerate(advice.ranked[:top], 1):
        est = v.estimate
        m = est.memory
        links = ", ".join(f"{x.axis} {x.bytes / 2**20:,.1f} {x.where}" for x in est.links) or "-"
        t.add_row(
            str(i),
            v.layout.label(),
            f"{_gib(m.params)}+{_gib(m.grads)}+{_gib(m.optimizer)}",
            f"{_gib(m.activations)}+{_gib(m.temporary)}",
            f"{_gib(m.total)}/{_gib(m.capacity)}",
            f"{est.bubble:.0%}",
            links,
            f"{est.step_s * 1e3:,.1f} ms",
            _rate(est.tokens_per_s),
            f"{est.mfu:.0%}",
        )
    why = Table(title="why", title_justify="left", show_header=False)
    why.add_column("#")
    why.add_column("reason")
    for i, v in enumerate(advice.ranked[:top], 1):
        why.add_row(str(i), v.why)
    if advice.reference_why:
        why.add_row("given", advice.reference_why)
    kinds = Counter(v.kind for v in advice.rejected)
    rej = Table(
        title="rejected: " + (", ".join(f"{n} {k}" for k, n in kinds.most_common()) or "none"),
        title_justify="left",
    )
    rej.add_column("layout")
    rej.add_column("reason")
    seen: set[str] = set()
    shown = 0
    for v in advice.rejected:  # one example per distinct reason, the first few
        key = (v.rejected or "").split(":")[0] + v.kind
        if key in seen or shown >= REJECTED_EXAMPLES:
            continue
        seen.add(key)
        shown += 1
        rej.add_row(v.layout.label(), v.rejected or "")
    return Group(t, why, rej)
