"""The one error type for a user's mistakes (config, plan, a model kind's checks): a list of
one-line problems. Imports nothing, so every package may raise it."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """Every problem found in a config, each a line naming the key, the value and what is allowed.

    The CLI prints them together and exits with code 2, never a traceback.
    """

    def __init__(self, problems: Iterable[str], config: object | None = None) -> None:
        self.problems = list(problems)
        self.config = config
        """The config composed without the overrides that were wrong (None if none was)."""
        super().__init__("\n".join(self.problems))
