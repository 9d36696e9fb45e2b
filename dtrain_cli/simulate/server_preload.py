"""Imported by the fork server of the simulated ranks (:mod:`dtrain_cli.simulate.run`):
the modules named in ``DTRAIN_SIMULATE_PRELOAD`` (:mod:`dtrain_cli.rundir.env`; the
model's: ``transformers`` for a Hugging Face model), each optional. multiprocessing's own
preload lets only an ``ImportError`` pass; here any failure is left to the ranks, which
import it again and report it as a rank's error. Only the server imports this module."""

from __future__ import annotations

import contextlib
import gc
import importlib

from dtrain_cli.rundir import env

for _name in env.simulate_preload():
    with contextlib.suppress(Exception):
        importlib.import_module(_name)

gc.freeze()  # every rank forked from here keeps what the server imported: never walked by its GC
