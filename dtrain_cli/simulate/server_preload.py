"""Imported by the fork server of the simulated ranks (:mod:`dtrain_cli.simulate.run`):
the modules named in ``DTRAIN_SIMULATE_PRELOAD`` (:mod:`dtrain_cli.rundir.env`: the
simulator, the trainer, then the model's: ``transformers`` for a Hugging Face model), each
optional, with the garbage collector paused and what they made frozen after
(:mod:`dtrain_cli.import_gc`). multiprocessing's own
preload lets only an ``ImportError`` pass; here any failure is left to the ranks, which
import it again and report it as a rank's error. Only the server imports this module."""

from __future__ import annotations

import contextlib
import importlib

from dtrain_cli.import_gc import imports_without_collection
from dtrain_cli.rundir import env

with imports_without_collection():  # every rank forked from here keeps them: frozen
    for _name in env.simulate_preload():
        with contextlib.suppress(Exception):
            importlib.import_module(_name)
