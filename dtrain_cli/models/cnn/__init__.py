"""The built-in conv + BatchNorm classifier (``model.kind=cnn_bn``): its config, its
torch-free spec and its module (:mod:`.net`, imported by workers only).
"""

from dtrain_cli.models.cnn.config import CNNConfig
from dtrain_cli.models.cnn.spec import CNNSpec

__all__ = ["CNNConfig", "CNNSpec"]
