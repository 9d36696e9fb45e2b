"""Sync modes by name (``sync.mode``): sync, local_sgd, param_server, diloco, ...

One file per mode: a :class:`~.base.SyncMode` subclass decorated with
:func:`~.base.register`, holding its torch-free facts (validation problems, bytes per step
per role, extra processes) and naming its runtime half, the loop's one sync seam
(:class:`dtrain_cli.runtime.sync.base.SyncRuntime`), imported on workers only.
"""

from dtrain_cli.sync_modes.base import SyncMode, UnknownSyncMode, mode_for, names

__all__ = ["SyncMode", "UnknownSyncMode", "mode_for", "names"]
