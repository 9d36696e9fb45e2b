"""Your own ``nn.Module`` (``model=custom model._target_=...``): its config and spec, built
through Hydra's ``instantiate``; the module itself is yours.
"""

from dtrain_cli.models.custom.spec import CustomModelConfig, CustomSpec

__all__ = ["CustomModelConfig", "CustomSpec"]
