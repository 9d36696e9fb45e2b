"""The command line: thin Typer commands over config -> plan -> launch."""
