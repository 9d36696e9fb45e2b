"""``transformers``, imported where a Hugging Face model needs it, or one line naming the
extra to install. Torch-free itself (transformers imports torch when it is used).
"""

from __future__ import annotations

from typing import Any

from dtrain_cli.errors import ConfigError

MISSING = "model=hf needs transformers: pip install 'dtrain[hf]'"


def transformers_module() -> Any:
    """``transformers``, or the one-line error naming the extra when it is not installed."""
    try:
        import transformers
    except ImportError:
        raise ConfigError([MISSING]) from None
    return transformers
