"""The run directory and what one dtrain process hands another: files by name
(:class:`RunDir`), environment variables (:mod:`.env`), exit codes, signals and markers
(:mod:`.protocol`), failure notes (:mod:`.notes`). Torch-free and importing nothing else
of dtrain, so every other package may import it.
"""

from dtrain_cli.rundir.layout import ENTRIES, RunDir

__all__ = ["ENTRIES", "RunDir"]
