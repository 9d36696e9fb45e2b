"""Hugging Face causal LMs (``model.kind=hf``): the config and torch-free spec (counts from
a meta build, checks), and the workers' side (:mod:`.net`: build, TP plan, stages, export).
"""

from dtrain_cli.models.hf.spec import HFConfig, HFSpec

__all__ = ["HFConfig", "HFSpec"]
