"""``dtrain recipes``: the recipes dtrain can run, with one line each."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from dtrain_cli.cli.common import CONFIG_DIR_HELP, fail, print_whole
from dtrain_cli.errors import ConfigError


def recipes(
    config_dir: list[Path] = typer.Option([], "--config-dir", "-c", help=CONFIG_DIR_HELP),
) -> None:
    """List recipes (built-in and from config folders) with their descriptions.

    Guide: docs/configuration.md
    """
    from dtrain_cli.config.search import list_recipes, recipe_description, reserved_problems

    try:
        found = list_recipes(config_dir)
    except ConfigError as exc:
        fail(exc.problems)
    if shadowed := reserved_problems(config_dir):
        fail(shadowed)
    table = Table(title="recipes")
    table.add_column("recipe", style="bold")
    table.add_column("description")
    table.add_column("file")
    for name, path in found.items():
        table.add_row(name, recipe_description(path), str(path))
    print_whole(table)
