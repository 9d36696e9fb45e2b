"""``dtrain advise recipe=gpt_small hardware=h100_80g parallel.nnodes=8``: ranked layouts.

    dtrain advise recipe=gpt_small hardware=cpu dp_max=4 --top 5 --json
    dtrain advise recipe=gpt_small hardware=cpu --apply > layout.txt
    xargs dtrain launch < layout.txt

Besides Hydra overrides it takes ``world=N`` (devices in all; default nnodes x the
hardware's devices per node) and ``dp_max=N`` (the most data-parallel replicas to try).
Overrides that set a layout (dp=48 tp=8 pp=2 parallel.strategy=... pipeline.schedule=...)
do not limit the search: that layout is costed too and #1 is explained against it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer

from dtrain_cli.cli.common import CONFIG_DIR_HELP, OVERRIDES_HELP, console, err_console, fail

ADVISE_ONLY = ("world", "dp_max")
SEARCHED = ("parallel.", "pipeline.", "dp=", "tp=", "pp=", "train.micro_batch_size=")


def _split(overrides: list[str]) -> tuple[list[str], dict[str, int]]:
    rest, opts = [], {}
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key in ADVISE_ONLY:
            if not value.isdigit() or int(value) < 1:
                fail([f"{ov}: {key} must be a whole number >= 1"])
            opts[key] = int(value)
        else:
            rest.append(ov)
    return rest, opts


def advise(
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP + " Also world=N, dp_max=N."),
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
    top: int | None = typer.Option(
        None, "--top", "-n", help="How many ranked layouts to show (default 5; --json: all)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="The ranked layouts (--top of them) and every rejected one as JSON."
    ),
    apply: bool = typer.Option(
        False, "--apply", help="Print the winner as overrides (xargs dtrain launch < that file)."
    ),
    simulate: bool = typer.Option(
        False,
        "--simulate",
        help="Check the top 3 layouts by simulating rank 0 for one step (dtrain simulate).",
    ),
    allow_cross_node_tp: bool = typer.Option(
        False, "--allow-cross-node-tp", help="Also rank layouts whose tp group spans nodes."
    ),
) -> None:
    """Rank every parallel layout for this model on this hardware by estimated throughput.

    Guide: docs/parallelism.md
    """
    from dtrain_cli.config.compose import compose_config, split_recipe
    from dtrain_cli.config.validate import config_problems
    from dtrain_cli.errors import ConfigError
    from dtrain_cli.plan.advise import advise as run_advice

    if top is not None and top < 1:
        fail([f"--top={top}: must be at least 1 (the layouts to show)"])
    if apply and as_json:
        fail(
            [
                "--apply and --json each print the whole answer (the winner's overrides, the "
                "ranking as JSON); choose one"
            ]
        )
    rest, opts = _split(overrides or [])
    try:
        recipe, rest = split_recipe(rest)
        cfg = compose_config(recipe, rest, config_dir, validate=False)
    except ConfigError as exc:
        fail(exc.problems)
    problems = [p for p in config_problems(cfg) if not p.startswith(("parallel.", "pipeline."))]
    if problems:
        fail(problems)
    from dtrain_cli.plan.advise_compare import layout_of, names_a_layout

    reference = layout_of(cfg) if names_a_layout(rest) else None
    try:
        advice = run_advice(
            cfg, opts.get("world"), opts.get("dp_max"), allow_cross_node_tp, reference
        )
    except ConfigError as exc:
        fail(exc.problems)
    kept = _kept(overrides or [], recipe)
    checked = None
    if simulate:
        from dtrain_cli.cli.advise_simulate import simulate_top

        checked = simulate_top(advice, kept, config_dir)
    if apply:  # with the config folders: a recipe of your own is not found without them
        winner = _winner(advice, checked)
        dirs = [x for d in config_dir for x in ("--config-dir", str(Path(d).resolve()))]
        typer.echo(" ".join(shlex.quote(x) for x in [*kept, *winner, *dirs]))
        return
    if as_json:
        typer.echo(json.dumps(_json(advice, checked, top), indent=2))
        return
    from dtrain_cli.cli.common import is_tty, print_whole
    from dtrain_cli.plan.advise_render import render_advice

    width = console.width if is_tty() else None  # piped: whole lines, never wrapped
    print_whole(render_advice(advice, top or 5, console, width))
    if checked is not None:
        from dtrain_cli.cli.advise_simulate import render

        print_whole(render(checked))


def _winner(advice, checked: list[dict] | None) -> list[str]:
    """#1's overrides; with --simulate, the first ranked layout whose simulated rank ran
    (what failed before it is said on stderr, stdout stays the overrides)."""
    if checked is None:
        return advice.ranked[0].layout.overrides(advice.nnodes)
    for verdict, c in zip(advice.ranked, checked, strict=False):  # checked: the top few
        if c["ok"]:
            return verdict.layout.overrides(advice.nnodes)
        line = f"note: {c['layout']} not applied: {c['status']}: {c['result']}"
        err_console.print(line, highlight=False, markup=False, soft_wrap=True)
    fail(
        [
            f"--apply --simulate: none of the top {len(checked)} layouts ran in simulation "
            f"({'; '.join(c['layout'] + ': ' + c['result'] for c in checked)})"
        ]
    )


def _kept(overrides: list[str], recipe: str) -> list[str]:
    """The user's overrides that the search does not set (for --apply and --simulate)."""
    from dtrain_cli.config.compose import expand_shorthands

    # nnodes=2 is parallel.nnodes=2, which the winner gives again
    kept = [ov for ov in overrides if not expand_shorthands([ov])[0].startswith(SEARCHED)]
    kept = [ov for ov in kept if ov.partition("=")[0] not in ADVISE_ONLY]
    if not any(ov.startswith("recipe=") for ov in kept):
        kept.insert(0, f"recipe={recipe}")
    return kept


def _json(advice, checked: list[dict] | None, top: int | None = None) -> dict:
    out = {
        "hardware": advice.hardware,
        "world_size": advice.world_size,
        "nnodes": advice.nnodes,
        "activations_estimated": advice.activations_estimated,
        "ranked": [v.to_dict() for v in advice.ranked[:top]],
        "rejected": [v.to_dict() for v in advice.rejected],
    }
    if advice.reference is not None:
        out["reference"] = advice.reference.to_dict() | {"compared": advice.reference_why}
    if checked is not None:
        out["simulated"] = checked
    return out
