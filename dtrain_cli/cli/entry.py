"""The ``dtrain`` command's entry point. A help page rendered before is printed again from
disk without importing Typer, rich or any command (:mod:`dtrain_cli.cli.help_cache`);
everything else runs the Typer app (:func:`dtrain_cli.cli.app.main`), and a help page it
renders is kept for the next time."""

from __future__ import annotations

import sys

from dtrain_cli.cli import help_cache


def main() -> None:
    key = help_cache.key_for(sys.argv[1:])  # None: not a help request
    if help_cache.serve(key):
        raise SystemExit(0)
    from dtrain_cli.cli.app import main as run_app

    with help_cache.recording(key):
        run_app()
