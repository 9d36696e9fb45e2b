"""PNG plots of a run (``dtrain report``) and of runs side by side (``dtrain compare``),
drawn with matplotlib's headless Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtrain_cli.report.runs import Comparison, RunData

BREAKDOWN = (
    ("forward_ms", "forward"),
    ("backward_compute_ms", "backward compute"),
    ("comm_exposed_ms", "exposed communication"),
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def _line(run: RunData, out: Path, name: str, title: str, keys: list[tuple[str, str, str]]) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, kind, label in keys:
        steps, values = run.series(key, kind)
        if steps:
            ax.plot(steps, values, marker="." if len(steps) < 50 else None, label=label)
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out / name)


def step_breakdown(run: RunData, out: Path) -> Path:
    """Per logging step: compute, data wait and exposed communication (ms per step)."""
    plt = _pyplot()
    train = run.kind("train")
    steps = [r["step"] for r in train]
    fig, ax = plt.subplots(figsize=(7, 4))
    layers: list[tuple[str, list[float]]] = []
    if any("forward_ms" in r for r in train):
        layers = [(label, [float(r.get(k, 0.0)) for r in train]) for k, label in BREAKDOWN]
    elif any("rank_compute_ms" in r for r in train):
        layers = [("compute", [float(r["rank_compute_ms"][0]) for r in train])]
    if any("rank_data_ms" in r for r in train):
        layers.append(("data wait", [float(r.get("rank_data_ms", [0.0])[0]) for r in train]))
    if layers:
        ax.stackplot(steps, *[v for _, v in layers], labels=[n for n, _ in layers], alpha=0.8)
    ax.plot(steps, [float(r["step_time_ms"]) for r in train], color="black", label="step time")
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title("step time breakdown")
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, out / "step_breakdown.png")


def per_rank(run: RunData, out: Path) -> Path | None:
    train = [r for r in run.kind("train") if "rank_step_ms" in r]
    if not train:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    # a run resumed at another world size logs more or fewer ranks from there on
    for rank in range(max(len(r["rank_step_ms"]) for r in train)):
        rows = [r for r in train if rank < len(r["rank_step_ms"])]
        own = [r["rank_compute_ms"][rank] + r["rank_data_ms"][rank] for r in rows]
        ax.plot([r["step"] for r in rows], own, label=f"rank {rank}")
    ax.set_xlabel("step")
    ax.set_ylabel("own time per step, ms (compute + data wait)")
    ax.set_title("per-rank step times (stragglers stand out)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, out / "ranks.png")


def report_plots(run: RunData, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        _line(
            run, out, "loss.png", "loss", [("loss", "train", "train"), ("val_loss", "val", "val")]
        ),
        _line(run, out, "lr.png", "learning rate", [("lr", "train", "lr")]),
        _line(
            run,
            out,
            "tokens_per_s.png",
            "throughput",
            [("tokens_per_s", "train", "tokens/s"), ("samples_per_s", "train", "samples/s")],
        ),
        step_breakdown(run, out),
    ]
    ranks = per_rank(run, out)
    return paths + ([ranks] if ranks else [])


def compare_plot(
    runs: list[RunData], comparison: Comparison, path: Path, labels: list[str] | None = None
) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = labels or [str(run.path) for run in runs]
    for i, label in enumerate(labels):
        ax.plot(comparison.steps, [row[i] for row in comparison.losses], label=label)
    if comparison.first_divergent is not None:
        ax.axvline(comparison.first_divergent, color="red", linestyle="--", label="first divergent")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title(f"loss; max rel diff {comparison.max_rel:.2e} at step {comparison.max_rel_step}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)
