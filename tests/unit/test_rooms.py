"""The rooms hold: no test under tests/unit starts a process (the guard fails it), every test
of tests/launch is marked ``multiproc``, and every test file sits in one of the two rooms."""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest

from tests.rooms import LAUNCH, TESTS, UNIT, ProcessGuard, room


def test_the_guard_refuses_every_way_to_start_a_process():
    starts = {
        "subprocess": lambda: subprocess.run(["true"], check=False),
        "Popen": lambda: subprocess.Popen(["true"]),
        "os.system": lambda: os.system("true"),
        "spawn": lambda: multiprocessing.get_context("spawn").Process(target=int).start(),
        "forkserver": lambda: multiprocessing.get_context("forkserver").Process(target=int).start(),
    }
    with ProcessGuard("this test") as guard:
        for name, start in starts.items():
            try:
                start()
            except Exception as e:  # what an `except Exception` in the code under test sees
                pytest.fail(f"{name}: the guard's failure was an Exception: {e!r}")
            except pytest.fail.Exception as e:
                assert "tests/unit starts no process" in str(e) and "tests/launch" in str(e)
            else:
                pytest.fail(f"{name}: started a process under the guard")
    assert len(guard.started) == len(starts)
    assert "true" in guard.started[0]  # the command is named
    with pytest.raises(pytest.fail.Exception, match="this test started a process"):
        guard.check()  # a failure swallowed on the way still fails the test


def test_every_unit_test_runs_under_the_guard(request):
    (guard,) = ProcessGuard.active  # tests/unit/conftest.py's, around this call
    assert guard.where == request.node.nodeid
    with pytest.raises(pytest.fail.Exception, match="tests/unit starts no process"):
        subprocess.run(["true"], check=False)
    assert guard.started
    guard.started.clear()  # started on purpose: not this test's failure


def test_the_launch_room_is_multiproc_and_the_unit_room_is_not(request):
    items = request.session.items
    assert any(room(item.path) == "unit" for item in items)
    for item in items:
        marked = item.get_closest_marker("multiproc") is not None
        assert marked is (room(item.path) == "launch"), item.nodeid


def test_every_test_file_is_in_a_room():
    everywhere = {p.relative_to(TESTS) for p in TESTS.rglob("test_*.py")}
    in_rooms = {p.relative_to(TESTS) for folder in (UNIT, LAUNCH) for p in folder.glob("*.py")}
    assert sorted(map(str, everywhere - in_rooms)) == [], "move it to tests/unit or tests/launch"
