"""The launcher's failure report names the first failure in time (launch/failures.py), from
the agent's per-worker results and the workers' notes. Torch-free, fast."""

from __future__ import annotations

from types import SimpleNamespace

from dtrain_cli.launch.failures import describe, from_agent

RESET = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer"


def agent_failure(pid: int, exitcode: int, timestamp: int, message: str = "") -> SimpleNamespace:
    """What torch's ProcessFailure holds: an error file's data for a Python exception,
    torch's own message for a signal."""
    data = {}
    if message:
        data = {"message": {"message": message, "extraInfo": {"py_callstack": "Traceback ..."}}}
    else:
        message = f"Signal {-exitcode} received by PID {pid}"
    return SimpleNamespace(
        pid=pid, exitcode=exitcode, timestamp=timestamp, message=message, error_file_data=data
    )


LOST = f"; rank 0 then lost its peer ({RESET})"


def test_a_killed_rank_is_named_not_the_rank_that_lost_it():
    """torch reports the first dead process it finds: often the rank that lost its peer."""
    failures = {0: agent_failure(100, 1, 1000, RESET)}
    note = {"pid": 100, "rank": 0, "step": 2, "time": 1000.4, "error": RESET}
    drill = {"pid": 101, "rank": 1, "step": 2, "time": 1000.1, "signal": "SIGKILL"}
    code, text = describe(from_agent(failures, {100: note, 101: drill}, [0, 1]))
    assert text == "rank 1 was killed by SIGKILL after step 2" + LOST and code == 1
    # no drill (the OOM killer): the rank that left no error of its own is named
    _, text = describe(from_agent(failures, {100: note}, [0, 1]))
    assert text == (
        "rank 1 ended without an error of its own (killed by a signal?) after step 2" + LOST
    )
    # the agent saw the killed rank itself: its exit code names the signal
    failures[1] = agent_failure(101, -9, 1000)
    _, text = describe(from_agent(failures, {100: note}, [0, 1]))
    assert text == "rank 1 was killed by SIGKILL after step 2" + LOST


def test_the_earlier_own_error_is_the_cause_and_its_traceback_shown():
    failures = {0: agent_failure(100, 1, 1001, RESET)}
    notes = {
        100: {"pid": 100, "rank": 0, "step": 0, "time": 1001.9, "error": RESET},
        101: {"pid": 101, "rank": 1, "step": 0, "time": 1001.2, "error": "KeyError: 'w'"},
    }
    code, text = describe(from_agent(failures, notes, [0, 1]))
    assert code == 1
    assert text == "rank 1 failed in step 1: KeyError: 'w'" + LOST
    failures = {1: agent_failure(101, 3, 1001, "KeyError: 'w'")}
    code, text = describe(from_agent(failures, notes, [0, 1]))
    assert code == 3 and text.startswith(
        "rank 1 failed in step 1 (exit code 3): KeyError: 'w'" + LOST
    )
    assert "KeyError: 'w'\nTraceback ..." in text


def test_a_rank_that_stopped_answering_is_named():
    timeout = "RuntimeError: [gloo] Timed out waiting 300000ms for recv operation to complete"
    failures = {0: agent_failure(100, 1, 1000, timeout)}
    notes = {100: {"pid": 100, "rank": 0, "step": 7, "time": 1000.1, "error": timeout}}
    _, text = describe(from_agent(failures, notes, [0, 1]))
    assert (
        text
        == f"rank 1 stopped answering (frozen?) after step 7; rank 0 then lost its peer ({timeout})"
    )
