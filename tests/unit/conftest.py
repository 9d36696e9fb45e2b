"""The unit room starts no process: the setup and the call of every test here run inside
tests/rooms.py's ProcessGuard, which fails the test at the first subprocess, fork, spawn or
multiprocessing start (a test that needs one belongs in tests/launch)."""

from __future__ import annotations

import os
import platform

import pytest

from tests.conftest import cache_dir
from tests.rooms import ProcessGuard

# what the tests compose and count in-process is kept in the session's cache, not the
# user's (~/.cache/dtrain), as for the launches (tests/conftest.py run_dtrain)
os.environ.setdefault("DTRAIN_CACHE", str(cache_dir()))

# platform.platform() (dtrain env) asks `uname -p` for the processor once and caches it: ask
# here, before any test runs under the guard.
platform.platform()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with ProcessGuard(f"{item.nodeid} (setup)") as guard:
        result = yield
    guard.check()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with ProcessGuard(item.nodeid) as guard:
        result = yield
    guard.check()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    if nextitem is None:  # the session's own fixtures end here too (a SLURM stopped)
        return (yield)
    with ProcessGuard(f"{item.nodeid} (teardown)") as guard:
        result = yield
    guard.check()
    return result
