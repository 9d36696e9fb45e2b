"""The command line: thin Typer commands over config -> plan -> launch."""

from dtrain_cli.cli import help_imports

help_imports.install()  # before Typer loads: its help renderer imports what dtrain never prints
