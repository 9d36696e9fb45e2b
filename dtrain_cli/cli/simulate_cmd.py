"""``dtrain simulate recipe=gpt_1b dp=64 tp=8 pp=2``: run ranks of a plan here, measured.

dtrain simulate recipe=gpt_1b parallel.strategy=fsdp dp=8,64,512,4096 --ranks 0   # sweep
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from dtrain_cli.cli.common import (
    CONFIG_DIR_HELP,
    OVERRIDES_HELP,
    compose_and_plan,
    console,
    fail,
    print_whole,
)


def simulate(
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP),
    ranks: str = typer.Option(
        "",
        "--ranks",
        help="Ranks to run, e.g. 0,511 (default: rank 0, the first rank of every other "
        "pipeline stage, and the first parameter server).",
    ),
    steps: int = typer.Option(
        2,
        "--steps",
        help="Training steps per rank (collectives and activations are measured on the last).",
    ),
    compute: str = typer.Option(
        "auto",
        "--compute",
        help="real | fake (shapes only, nothing allocated) | auto (fake for steps too large here).",
    ),
    jobs: int = typer.Option(
        0, "--jobs", help="Ranks run at once (default 0: as many as there are cores)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    out: Path | None = typer.Option(
        None, "--out", help="Folder for the run dirs and the sweep's plot (default: run.root)."
    ),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
) -> None:
    """Run the real start-up and training steps of chosen ranks of a plan on this machine,
    on a fake process group; show what each rank holds and sends next to the plan.
    A comma list on one key (dp=8,64,512) is a sweep: a table per value, one row
    per value at the end, and a plot.

    Guide: docs/simulate.md
    """
    from dtrain_cli.simulate.sweep import split_sweep

    if compute not in ("auto", "real", "fake"):
        fail([f"--compute={compute}: choose auto, real or fake"])
    if steps < 1:
        fail([f"--steps={steps}: must be >= 1"])
    if jobs < 0:
        fail([f"--jobs={jobs}: must be >= 0"])
    runs = split_sweep(overrides or [])
    if isinstance(runs, str):
        fail([runs])
    try:  # every value of a sweep is checked before the first one runs
        layouts = [check_layout(ovs, config_dir, ranks, compute) for _label, ovs in runs]
    except SimulateFailed as exc:
        fail(exc.lines)
    docs, points = [], []
    for layout in layouts:
        try:
            doc = simulate_layout(layout, (steps, jobs), out)
        except SimulateFailed as exc:
            fail(exc.lines)
        except KeyboardInterrupt:  # run_ranks has ended every rank it started
            done = f"; the {len(docs)} layout(s) done are in their run dirs" if docs else ""
            fail([f"stopped by SIGINT; no simulated rank left running{done}"], 130)
        docs.append(doc)
        if not as_json:
            from dtrain_cli.simulate.report import render

            print_whole(render(doc["plan"], doc["ranks"], doc["title"]))
            for note in doc["notes"]:
                console.print(f"note: {note}", soft_wrap=True)
        points.append(doc)
    if len(runs) > 1:
        _sweep_plot([label for label, _ in runs], points, out, as_json)
    if as_json:
        sys.stdout.write(json.dumps([_public(d) for d in docs], indent=1) + "\n")


class SimulateFailed(Exception):
    """A simulated rank failed: one line per rank (what ``dtrain simulate`` prints)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines[0])
        self.lines = lines


class NotSimulated(SimulateFailed):
    """The layout is valid but this simulator cannot run it (said before any rank runs)."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One layout to simulate, checked: its config, plan and the ranks to run."""

    cfg: Any
    plan: Any
    ranks: list[int]
    compute: str
    """real or fake: ``--compute``, with ``auto`` resolved for this layout."""


def check_layout(
    ovs: list[str], config_dir: list[Path], ranks_arg: str, compute: str = "auto"
) -> Layout:
    """Plan ``ovs`` and check it can be simulated here, starting nothing. Raises
    :class:`SimulateFailed`; a plan error exits as ``dtrain plan`` does."""
    from dtrain_cli.models import model_spec
    from dtrain_cli.simulate.expect import MAX_WORLD, default_ranks
    from dtrain_cli.simulate.run import choose_compute

    cfg, plan = compose_and_plan(ovs, config_dir, on_hardware=True)
    if plan.world_size > MAX_WORLD:
        raise SimulateFailed(
            [f"world size {plan.world_size:,}: simulate runs worlds up to {MAX_WORLD:,}"]
        )
    mode = choose_compute(plan, model_spec(cfg).facts().tokens_per_sample, compute)
    ranks = _parse_ranks(ranks_arg, plan.world_size) or default_ranks(plan)
    _check_param_server_compute(plan, mode)
    return Layout(cfg=cfg, plan=plan, ranks=ranks, compute=mode)


def _check_param_server_compute(plan: Any, compute: str) -> None:
    """A parameter server's worker reads its servers' replies, so its tensors must hold
    data (its servers' ranks run their own loop, on real tensors of their shard)."""
    if plan.sync is None or not plan.sync.servers or compute != "fake":
        return
    raise NotSimulated(
        [
            "--compute fake: a parameter server's worker reads its servers' replies, "
            "which fake tensors do not hold; use --compute real"
        ]
    )


def simulate_layout(layout: Layout, steps_jobs: tuple[int, int], out) -> dict:
    """Run a checked layout's ranks, compare: the document ``--json`` prints (with the
    plan). Raises :class:`SimulateFailed` when a rank fails."""
    from dtrain_cli.cli.launch_cmd import prepare_data
    from dtrain_cli.launch.rundir import materialize, new_run_dir
    from dtrain_cli.models import model_spec
    from dtrain_cli.simulate.expect import coords_of, server_params
    from dtrain_cli.simulate.report import compare_server
    from dtrain_cli.simulate.run import run_ranks

    steps, jobs = steps_jobs
    cfg, plan, ranks = layout.cfg, layout.plan, layout.ranks
    prepare_data(cfg)
    run_dir = materialize(cfg, plan, _simulate_dir(new_run_dir(cfg), out, cfg.run.name))
    spec, mode = model_spec(cfg), layout.compute
    results = run_ranks(run_dir, ranks, steps, mode, jobs=jobs, model_modules=spec.worker_modules())
    layout = " x ".join(
        f"{n}={s}" for n, s in zip(plan.mesh.dim_names, plan.mesh.shape, strict=True)
    )
    bad = [r for r in results if not r.get("ok")]
    if bad:
        raise SimulateFailed(
            [_rank_error(r, coords_of(plan, r["rank"]), layout, plan) for r in bad]
        )
    rows = [
        compare_server(plan, r, server_params(spec, plan, r["rank"]))
        if "server" in r["coords"]
        else _compare_rank(plan, r, spec)
        for r in results
    ]
    title = (
        f"simulate: world {plan.world_size:,} ({layout}, {plan.strategy}), {mode} "
        f"compute, {steps} step(s); run dir {run_dir}"
    )
    from dtrain_cli.plan.fit import SAYS
    from dtrain_cli.plan.steptime import peak_memory

    notes = cuda_notes(cfg, plan) + [w for w in plan.warnings if w.startswith(SAYS)]
    peak = peak_memory(cfg, spec, plan, cfg.hardware)
    doc = {"plan": plan, "ranks": rows, "title": title, "run_dir": str(run_dir), "notes": notes}
    doc["peak"] = {"estimate": peak.total, "capacity": peak.capacity}
    (run_dir / "simulate" / "report.json").write_text(json.dumps(_public(doc), indent=1))
    return doc


def _compare_rank(plan: Any, result: dict, spec: Any) -> dict:
    from dtrain_cli.simulate.expect import rank_params, stage_share
    from dtrain_cli.simulate.report import compare

    count = rank_params(spec, plan, result["rank"])
    share = stage_share(spec, plan, result["rank"])
    return compare(plan, result, count.params, share, allocated=count.allocated)


def cuda_notes(cfg: Any, plan: Any) -> list[str]:
    """What a CUDA plan runs differently here: said next to the table."""
    from dtrain_cli.models import model_spec

    if plan.device != "cuda":
        return []
    notes = [
        f"planned for {plan.nnodes:,} node{'s' * (plan.nnodes > 1)} x {plan.nproc_per_node} "
        f"{cfg.hardware.name} ({plan.backend}, CUDA): simulated here on CPU tensors and the "
        f"fake process group; byte sizes and collectives are the plan's"
    ]
    notes += model_spec(cfg).cpu_differences()
    if plan.precision.loss_scaling:
        notes.append(
            f"precision={cfg.precision.name} (CUDA only in a launch): its autocast and "
            f"GradScaler ran on CPU tensors here, with {cfg.precision.name}'s byte sizes"
        )
    return notes


def _simulate_dir(path: Path, out: Path | None, named: str | None) -> Path:
    """``<run>-simulate`` (under ``out`` if given); an unnamed run takes ``-1``, ``-2`` ...
    when one started in the same second holds it (advise --simulate runs three)."""
    base = out / path.name if out else path
    found, k = base.with_name(f"{base.name}-simulate"), 1
    while found.exists() and named is None:
        found, k = base.with_name(f"{base.name}-{k}-simulate"), k + 1
    return found


def _rank_error(r: dict, coords: dict, layout: str, plan) -> str:
    where = ", ".join(f"{k}={v}" for k, v in coords.items())
    return (
        f"rank {r['rank']} ({where}) of world {plan.world_size:,} ({layout}, "
        f"{plan.strategy}) failed: {r['error']}"
    )


def _parse_ranks(text: str, world: int) -> list[int]:
    if not text:
        return []
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail([f"--ranks={text}: not a comma list of ranks (e.g. 0,511)"])
    if outside := [r for r in ranks if not 0 <= r < world]:
        fail([f"--ranks={text}: {outside[0]} is outside the world (ranks 0..{world - 1})"])
    return list(dict.fromkeys(ranks))


def _public(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("plan", "title")} | {
        "world_size": doc["plan"].world_size,
        "estimates": doc["plan"].to_dict()["estimates"],
    }


def _sweep_plot(labels: list[str], docs: list[dict], out: Path | None, quiet: bool) -> None:
    from dtrain_cli.simulate.report import plot_sweep, sweep_point, sweep_table

    points = [sweep_point(d["plan"], d["ranks"][0], d["peak"]) for d in docs]
    if not quiet:
        print_whole(sweep_table(labels, points))
    folder = out or Path(docs[-1]["run_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    path = plot_sweep(points, folder / "simulate_sweep.png")
    if not quiet:
        console.print(f"sweep plot: {path}", highlight=False)
