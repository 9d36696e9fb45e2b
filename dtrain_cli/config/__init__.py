"""Composition (Hydra) and validation of the typed run config. Torch-free."""

from dtrain_cli.config.errors import ConfigError
from dtrain_cli.config.schema import DtrainConfig

__all__ = ["ConfigError", "DtrainConfig"]
