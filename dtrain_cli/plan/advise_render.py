"""``dtrain advise`` on screen: the ranked layouts and why the others were rejected.

A number is never split across lines: the ranked table is printed whole when it fits the
terminal (or at its natural width when the output is piped), else each layout becomes a
paragraph that wraps between values.
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from dtrain_cli.plan.advise import Advice, Verdict
from dtrain_cli.plan.steptime import GIB

REJECTED_EXAMPLES = 8
COLUMNS = (
    "#",
    "layout",
    "param+grad+optim",
    "activ+temp",
    "total/capacity",
    "bubble",
    "MiB/step per link",
    "step",
    "{unit}/s",
    "MFU",
)
WRAPS = {"layout", "MiB/step per link"}  # text with spaces between values; the rest no_wrap


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


def _cells(i: int, v: Verdict) -> list[str]:
    est = v.estimate
    m = est.memory
    links = ", ".join(f"{x.axis} {x.bytes / 2**20:,.1f} {x.where}" for x in est.links) or "-"
    return [
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
    ]


NOT_ESTIMATED = (
    "activations not estimated (the model's inputs come from your dataset): memory and fit "
    "leave them out"
)


def _title(advice: Advice) -> str:
    unknown = "" if advice.activations_estimated else f"; {NOT_ESTIMATED}"
    return (
        f"{advice.world_size} x {advice.hardware} ({advice.nnodes} node(s)): "
        f"{len(advice.ranked)} layouts fit, {len(advice.rejected)} rejected; memory in GiB "
        f"per device{unknown}"
    )


def ranked_table(advice: Advice, top: int) -> Table:
    t = Table(title=_title(advice), title_justify="left")
    for col in COLUMNS:
        t.add_column(col.format(unit=advice.unit), no_wrap=col not in WRAPS)
    for i, v in enumerate(advice.ranked[:top], 1):
        t.add_row(*_cells(i, v))
    return t


def ranked_paragraphs(advice: Advice, top: int) -> Group:
    """Each layout as lines that wrap between values (a terminal too narrow for the table)."""
    rows: list[Text] = [Text(_title(advice))]
    for i, v in enumerate(advice.ranked[:top], 1):
        c = _cells(i, v)
        rows.append(
            Text(
                f"#{c[0]} {c[1]}: {c[2]} (param+grad+optim) + {c[3]} (activ+temp) = {c[4]} GiB; "
                f"bubble {c[5]}; MiB/step per link {c[6]}; step {c[7]}; {c[8]} "
                f"{advice.unit}/s; MFU {c[9]}"
            )
        )
        rows.append(Text(f"   why: {v.why}"))
    return Group(*rows)


def rejected_table(advice: Advice) -> Table:
    """One example per distinct reason (the first few), with how many layouts it stands for."""
    kinds = Counter(v.kind for v in advice.rejected)
    rej = Table(
        title="rejected: " + (", ".join(f"{n} {k}" for k, n in kinds.most_common()) or "none"),
        title_justify="left",
    )
    rej.add_column("layouts", justify="right", no_wrap=True)
    rej.add_column("e.g.")
    rej.add_column("reason")
    count = Counter(_reason_key(v) for v in advice.rejected)
    seen: set[str] = set()
    for v in advice.rejected:
        key = _reason_key(v)
        if key in seen or len(seen) >= REJECTED_EXAMPLES:
            continue
        seen.add(key)
        rej.add_row(str(count[key]), v.layout.label(), v.rejected or "")
    if len(count) > len(seen):
        rest = sum(n for k, n in count.items() if k not in seen)
        rej.add_row(str(rest), "", f"{len(count) - len(seen)} other reasons (--json lists all)")
    return rej


def _reason_key(v: Verdict) -> str:
    return (v.rejected or "").split(":")[0] + v.kind


def render_advice(advice: Advice, top: int, console: Console, width: int | None) -> Group:
    """``width`` None: printed at the table's natural width (piped); else the terminal's,
    where a table that does not fit becomes paragraphs."""
    table = ranked_table(advice, top)
    if width is not None:
        need = Measurement.get(console, console.options.update(width=10**4), table).maximum
        if need > width:
            return Group(ranked_paragraphs(advice, top), rejected_table(advice))
    why = Table(title="why", title_justify="left", show_header=False)
    why.add_column("#")
    why.add_column("reason")
    for i, v in enumerate(advice.ranked[:top], 1):
        why.add_row(str(i), v.why)
    if advice.reference_why:
        why.add_row("given", advice.reference_why)
    return Group(table, why, rejected_table(advice))
