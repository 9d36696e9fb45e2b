"""``dtrain plan recipe=gpt_small dp=2``: the resolved plan, nothing run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dtrain_cli.cli.common import (
    CONFIG_DIR_HELP,
    OVERRIDES_HELP,
    complete_override,
    compose_and_plan,
    console,
    fail,
    print_warnings,
    print_whole,
)

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig

FORMATS = ("table", "yaml", "json")


def plan(
    overrides: list[str] = typer.Argument(
        None, help=OVERRIDES_HELP, autocompletion=complete_override
    ),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    fmt: str = typer.Option(
        "table",
        "--format",
        "-f",
        help="table | yaml (the plan.yaml a launch writes, with step_estimate: the table's "
        "last line) | json; with --show-config, yaml "
        "and json hold one document with keys config and plan.",
    ),
    show_config: bool = typer.Option(
        False, "--show-config", help="Also print the resolved config."
    ),
) -> None:
    """Compose the config and print the plan: layout, batch, LR, checkpoints, estimates.
    With a script (``dtrain plan dp=4 -- train.py``): what ``dtrain run`` would start.

    Guide: docs/configuration.md
    """
    from dtrain_cli.cli.script_args import split_script

    if fmt not in FORMATS:
        fail([f"--format={fmt}: not a format; choose one of {', '.join(FORMATS)}"])
    overrides, script = split_script(overrides or [])
    cfg, the_plan = compose_and_plan(overrides, config_dir, script)
    if the_plan.nnodes > 1:
        print_warnings(node_warnings(cfg))
    if fmt in ("yaml", "json"):
        import sys

        doc = the_plan.to_dict()
        if the_plan.script is None:  # a script's step time is its own business
            doc["step_estimate"] = step_estimate_doc(cfg, the_plan)
        if show_config:
            from dtrain_cli.config.compose import config_container

            doc = {"config": config_container(cfg), "plan": doc}
        sys.stdout.write(_dump(doc, fmt))
        return
    if show_config:
        from dtrain_cli.config.compose import config_to_yaml

        console.print(config_to_yaml(cfg), markup=False, highlight=False)
    from dtrain_cli.plan.render import render_plan, render_script

    if the_plan.script is not None:
        lc = cfg.launcher
        print_whole(render_script(the_plan, lc.rdzv_endpoint, lc.rdzv_timeout_s))
    from dtrain_cli.plan.naming import borrows_defaults

    print_whole(render_plan(the_plan, recipe_named=not borrows_defaults(cfg)))
    if the_plan.script is None:  # a script's step time is its own business
        console.print(step_line(cfg, the_plan), highlight=False)


def node_warnings(cfg: DtrainConfig) -> list[str]:
    """What ``dtrain launch``/``run`` of this multi-node plan would still need on each node
    (their refusals, as warnings): ``dtrain sbatch`` and ``dtrain k8s`` set both."""
    import copy

    from dtrain_cli.launch.multinode import NodeArgs, apply_node_args

    needs = apply_node_args(copy.deepcopy(cfg), NodeArgs())
    return [f"{w}; dtrain sbatch and dtrain k8s set it for you" for w in needs]


def _estimate(cfg, the_plan):
    """The advisor's estimate for this one layout on ``hardware`` (``dtrain advise`` ranks
    all of them with the same code)."""
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.steptime import estimate_step

    return estimate_step(cfg, model_spec(cfg), the_plan, cfg.hardware)


def step_estimate_doc(cfg, the_plan) -> dict:
    """The step line's figures for a loader (``--format json|yaml``): the same estimate."""
    est = _estimate(cfg, the_plan)
    m = est.memory
    return {
        "hardware": cfg.hardware.name,
        "step_ms": round(est.step_s * 1e3, 3),
        f"{the_plan.batch.unit}_per_s": round(est.tokens_per_s, 1),
        "mfu": round(est.mfu, 4),
        "bubble": round(est.bubble, 4),
        "peak_memory_bytes": int(m.total),
        "device_memory_bytes": int(m.capacity),
        "fits": m.fits,
        "activations_estimated": the_plan.estimates.activations_estimated,
    }


def step_line(cfg, the_plan) -> str:
    """The estimate as one line under the plan's table."""
    from dtrain_cli.plan.render import bytes_text

    est = _estimate(cfg, the_plan)
    m, unit = est.memory, the_plan.batch.unit
    unknown = "" if the_plan.estimates.activations_estimated else " + activations (not estimated)"
    return (
        f"estimated on hardware={cfg.hardware.name}: step {est.step_s * 1e3:,.1f} ms, "
        f"{est.tokens_per_s:,.0f} {unit}/s, MFU {est.mfu:.0%}, bubble {est.bubble:.0%}; peak "
        f"memory {bytes_text(int(m.total))}{unknown} of {bytes_text(int(m.capacity))} per "
        f"device, as the step runs (dtrain advise ranks every layout)"
    )


def _dump(doc: dict, fmt: str) -> str:
    """Plain text for a loader: not through rich (no wrapping at the terminal's width)."""
    if fmt == "json":
        import json

        return json.dumps(doc, indent=2) + "\n"
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)
