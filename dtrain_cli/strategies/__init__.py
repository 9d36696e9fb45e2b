"""Data-parallel strategies by name (``parallel.strategy``): ddp, zero1, fsdp, hsdp, ...

One file per strategy: a :class:`~.base.Strategy` subclass decorated with
:func:`~.base.register`, holding its torch-free facts (validation problems, memory and
communication estimates, what the advisor needs) and naming its runtime half (wrap the
model and optimizer, backward-sync control, checkpoint state), imported on workers only.
Lightning Fabric's strategy registry is the pattern; the models' ``ModelSpec`` the house's.
"""

from dtrain_cli.strategies.base import Strategy, UnknownStrategy, names, strategy_for

__all__ = ["Strategy", "UnknownStrategy", "names", "strategy_for"]
