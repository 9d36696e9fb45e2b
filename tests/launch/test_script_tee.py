"""A ``dtrain run`` rank's tee (:mod:`dtrain_cli.runtime.script.tee`): a process forked
from the rank that forwards its stdout and stderr, whole lines, to the console and its log;
what a rank wrote is all there when its end returns, and even after it died by a signal
(tests/launch/test_script_run.py). Forks: the launch room."""

from __future__ import annotations

import os
import signal
import time

from dtrain_cli.runtime.script import tee


def _lines(n: int, tag: str) -> list[str]:
    return [f"{tag} line {i:04d} " + "x" * 60 for i in range(n)]


def test_output_written_last_reaches_the_log_when_the_pump_is_slow(tmp_path, monkeypatch):
    """A loaded machine can keep the pump from running for seconds: what is still in the
    pipe when the rank exits would be lost, and the launcher would show an older line
    than the traceback (a CI failure: "rank 1 about to fail" for "ValueError: boom")."""
    real_forward = tee.forward
    slowed: set[int] = set()

    def slow_forward(data: bytes, console: int, log: int) -> None:
        if data and console not in slowed:  # each pump's first lines wait
            slowed.add(console)
            time.sleep(5.0)  # longer than the 2 s each pump was given before
        real_forward(data, console, log)

    monkeypatch.setattr(tee, "forward", slow_forward)
    log = tmp_path / "rank_0.log"
    wanted = _lines(600, "out")  # 44 KB: all of it fits in the pipe, no write waits
    with tee.tee_output(log):
        os.write(1, ("\n".join(wanted[:300]) + "\n").encode())
        os.write(2, b"Traceback (most recent call last):\nValueError: boom from rank 1\n")
        os.write(1, ("\n".join(wanted[300:]) + "\n").encode())
    text = log.read_text().splitlines()
    assert [line for line in text if line.startswith("out ")] == wanted
    assert "ValueError: boom from rank 1" in text


def test_a_child_holding_the_pipe_does_not_hold_the_end(tmp_path):
    """A process the script started (here: a second write end, as a child's inherited fd
    1 is) keeps the pipe open: the drain ends once everything written is forwarded, not
    after its full wait."""
    log = tmp_path / "rank_0.log"
    with tee.tee_output(log):
        held = os.dup(1)  # the pump never sees the pipe's end while this is open
        os.write(1, b"before the end\npartial without a newline")
        start = time.monotonic()
    waited = time.monotonic() - start
    try:
        assert waited < 5.0, waited  # well under DRAIN_S
        assert log.read_text() == "before the end\npartial without a newline"
    finally:
        os.close(held)


def test_the_tee_outlives_a_rank_killed_with_its_lines_in_the_pipe(tmp_path):
    """A process that writes and dies at once by SIGKILL (the OOM killer): its lines were
    in the pipe, read by a thread of the dead process. The tee reads them after."""
    log = tmp_path / "rank_1.log"
    pid = os.fork()
    if pid == 0:  # the rank
        try:
            with tee.tee_output(log):
                os.write(1, b"line 1\n")
                os.write(2, b"line 2 why it died\n")
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(3)  # not reached
    _, status = os.waitpid(pid, 0)
    assert os.WTERMSIG(status) == signal.SIGKILL
    deadline = time.monotonic() + 10
    while log.read_text().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(log.read_text().splitlines()) == ["line 1", "line 2 why it died"]


def test_a_last_line_without_its_newline_gets_one(tmp_path):
    """The launcher's "done: ..." was glued to a script's last line without a newline, on
    the console; in the log the line stayed open. Unfinished lines before the end stay as
    written (a progress bar's)."""
    log = tmp_path / "rank_0.log"
    with tee.tee_output(log):
        os.write(1, b"a progress bar 50%\r")
        os.write(1, b"last without newline")
    assert log.read_bytes() == b"a progress bar 50%\rlast without newline\n"


def test_the_tee_is_no_child_of_the_rank(tmp_path):
    """A script that reaps its own children with ``os.wait()`` until there are none would
    wait for the tee (it lives as long as the script's output)."""
    pid = os.fork()
    if pid == 0:  # the rank, with no child of its own
        code = 3
        try:
            with tee.tee_output(tmp_path / "rank_0.log"):
                try:
                    os.waitpid(-1, os.WNOHANG)
                    code = 1  # a child: the tee
                except ChildProcessError:
                    code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_drain_waits_for_the_newline_of_a_line_sent_unfinished(tmp_path):
    """A line sent unfinished on its timer, then the end: the drain returned while the tee
    was idle, before it wrote the newline (a reviewer's find); the console's next line was
    glued to it."""
    log = tmp_path / "rank_0.log"
    with tee.tee_output(log):
        os.write(1, b"progress 50%")
        time.sleep(tee.PARTIAL_LINE_S + 0.35)  # sent as it is, the tee idle again
    assert log.read_bytes() == b"progress 50%\n"


def test_the_tee_keeps_none_of_the_ranks_other_files(tmp_path):
    """Under start_method=fork the rank holds the pipe that tells the agent it ended: a tee
    holding it too (while a child of the script kept the output pipe) hid the rank's end
    from the agent, and the run hung (a reviewer's find)."""
    import select

    other_r, other_w = os.pipe()  # as multiprocessing's: its end says the rank ended
    pid = os.fork()
    if pid == 0:  # the rank
        os.close(other_r)
        code = 3
        try:
            with tee.tee_output(tmp_path / "rank_0.log"):
                if os.fork() == 0:  # a child of the script: keeps fd 1 (the pipe) 8 s
                    os.close(other_w)
                    time.sleep(8)
                    os._exit(0)
                code = 0
        finally:
            os._exit(code)
    os.close(other_w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    deadline = time.monotonic() + 3
    while not select.select([other_r], [], [], 0.05)[0]:  # its end, while the tee lives on
        assert time.monotonic() < deadline, "the tee holds the rank's other pipe"
    assert os.read(other_r, 1) == b""
    os.close(other_r)
