"""dtrain: a declarative, config-driven launcher for distributed PyTorch training."""

__version__ = "0.1.0"
