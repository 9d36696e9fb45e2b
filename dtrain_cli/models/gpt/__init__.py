"""The built-in GPT (``model.kind=gpt``): its config, its torch-free spec (counts, checks)
and its module (:mod:`.net`, imported by workers only).
"""

from dtrain_cli.models.gpt.config import GPTConfig
from dtrain_cli.models.gpt.spec import GPTSpec

__all__ = ["GPTConfig", "GPTSpec"]
