"""``dtrain plan recipe=gpt_small dp=2``: the resolved plan, nothing run."""

from __future__ import annotations

from pathlib import Path

import typer

from dtrain_cli.cli.common import CONFIG_DIR_HELP, OVERRIDES_HELP, compose_and_plan, console


def plan(
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    fmt: str = typer.Option(
        "table", "--format", "-f", help="table | yaml (the plan.yaml a launch writes)"
    ),
    show_config: bool = typer.Option(
        False, "--show-config", help="Also print the resolved config."
    ),
) -> None:
    """Compose the config and print the plan: layout, batch, LR, checkpoints, estimates."""
    cfg, the_plan = compose_and_plan(overrides or [], config_dir)
    if show_config:
        from dtrain_cli.config.compose import config_to_yaml

        console.print(config_to_yaml(cfg), markup=False, highlight=False)
    if fmt == "yaml":
        console.print(the_plan.to_yaml(), markup=False, highlight=False)
        return
    from dtrain_cli.plan.render import render_plan

    console.print(render_plan(the_plan))
    console.print(step_line(cfg, the_plan), highlight=False)


def step_line(cfg, the_plan) -> str:
    """The advisor's estimate for this one layout on ``hardware`` (``dtrain advise`` ranks
    all of them with the same code)."""
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.steptime import GIB, estimate_step

    est = estimate_step(cfg, model_spec(cfg), the_plan, cfg.hardware)
    m, unit = est.memory, the_plan.batch.unit
    return (
        f"estimated on hardware={cfg.hardware.name}: step {est.step_s * 1e3:,.1f} ms, "
        f"{est.tokens_per_s:,.0f} {unit}/s, MFU {est.mfu:.0%}, bubble {est.bubble:.0%}; peak "
        f"memory {m.total / GIB:.2f} of {m.capacity / GIB:.2f} GiB per device "
        f"(dtrain advise ranks every layout)"
    )
