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
    title, layers = breakdown_layers(run)
    if layers:
        ax.stackplot(steps, *[v for _, v in layers], labels=[n for n, _ in layers], alpha=0.8)
    ax.plot(steps, [float(r["step_time_ms"]) for r in train], color="black", label="step time")
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, out / "step_breakdown.png")


def breakdown_layers(run: RunData) -> tuple[str, list[tuple[str, list[float]]]]:
    """(title, the stacked bands per logging step). DDP times one sampled micro-batch a
    window: its forward and backward compute count once per micro-batch of the step
    (gradient accumulation), its exposed communication once (the last micro-batch's)."""
    train = run.kind("train")
    layers: list[tuple[str, list[float]]] = []
    title = "step time breakdown"
    if any("forward_ms" in r for r in train):
        accum = _grad_accum(run.path)
        for key, label in BREAKDOWN:
            times = accum if key != "comm_exposed_ms" else 1
            layers.append((label, [float(r.get(key, 0.0)) * times for r in train]))
        title += " (forward, backward: DDP's one sampled step a window" + (
            f" x {accum} micro-batches)" if accum > 1 else ")"
        )
    elif any("rank_compute_ms" in r for r in train):
        layers = [("compute", [float(r["rank_compute_ms"][0]) for r in train])]
    if any("rank_data_ms" in r for r in train):
        layers.append(("data wait", [float(r.get("rank_data_ms", [0.0])[0]) for r in train]))
    return title, layers


def _grad_accum(path: Path) -> int:
    """The run's micro-batches a step (its plan.yaml's), 1 when it does not say."""
    import yaml

    try:
        batch = (yaml.safe_load((path / "plan.yaml").read_text()) or {}).get("batch") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return 1
    accum = batch.get("grad_accum") if isinstance(batch, dict) else None
    return accum if isinstance(accum, int) and accum > 0 else 1


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
