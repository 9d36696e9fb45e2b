"""One launcher per run directory: ``launcher.lock`` (:mod:`dtrain_cli.rundir.lock`)."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from dtrain_cli.rundir import lock
from dtrain_cli.rundir.layout import RunDir


def test_a_held_run_dir_names_its_holder_and_this_process_may_take_it_again(tmp_path):
    other = os.open(RunDir(tmp_path).launcher_lock, os.O_RDWR | os.O_CREAT)  # another launcher
    fcntl.flock(other, fcntl.LOCK_EX)
    info = {"pid": 4242, "since": "07:25:44", "argv": ["/x/bin/dtrain", "launch", "dp=2"]}
    os.write(other, json.dumps(info).encode())
    with pytest.raises(lock.RunInUse) as exc:
        lock.hold(tmp_path)
    assert str(exc.value) == (
        f"{tmp_path}: in use by a running dtrain (pid 4242 since 07:25:44: dtrain launch dp=2); "
        "wait for it to end or stop it (Ctrl-C, or kill that pid), then resume"
    )
    os.close(other)  # that launcher ended: the kernel released its lock
    lock.hold(tmp_path)
    lock.hold(tmp_path)  # the same process again (launch, then start_workers): nothing more
    held = json.loads(RunDir(tmp_path).launcher_lock.read_text())
    assert held["pid"] == os.getpid()
    probe = os.open(RunDir(tmp_path).launcher_lock, os.O_RDWR)
    with pytest.raises(BlockingIOError):
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(probe)


def test_a_start_in_a_scheduler_job_waits_for_a_lock_let_go(tmp_path, capsys):
    """A requeued job's node may find the run dir still locked by a dead node's NFS lease:
    there the start tries for a while (lock.SCHEDULER_WAIT_S) instead of failing at once."""
    import threading

    other = os.open(RunDir(tmp_path).launcher_lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)
    threading.Timer(1.0, os.close, args=(other,)).start()  # the lease runs out
    with pytest.raises(lock.RunInUse):
        lock.hold(tmp_path, wait_s=0.0)
    capsys.readouterr()
    lock.hold(tmp_path, wait_s=10.0)
    # the job's log says why its start waits (it was silent for up to two minutes)
    assert (
        capsys.readouterr().err
        == f"{tmp_path}: waiting up to 10 s for its lock, held (its pid unknown)\n"
    )
    assert json.loads(RunDir(tmp_path).launcher_lock.read_text())["pid"] == os.getpid()
    assert lock.SCHEDULER_WAIT_S >= 90  # an NFSv4 lease


def test_a_file_system_without_flock_warns_and_goes_on(tmp_path, monkeypatch, capsys):
    """flock's ENOLCK / EOPNOTSUPP (Lustre without flock, FUSE, NFS without lockd) read as
    'in use by a running dtrain': every start there was refused (a reviewer's find)."""
    import errno

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)
    lock.hold(tmp_path, wait_s=5.0)  # at once: nothing to wait for
    said = capsys.readouterr().err
    assert said.startswith(f"warning: {tmp_path}: no lock on this file system (")


def test_a_run_dir_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """A read-only run dir (`dtrain resume` of a run on a read-only mount) ended in an
    OSError traceback from the lock's open."""
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(lock.os, "open", read_only)
    with pytest.raises(lock.RunInUse) as err:
        lock.hold(tmp_path)
    assert str(err.value) == (
        f"{tmp_path}: cannot write in it (Read-only file system); a run dir must be writable "
        "(its checkpoints, logs and metrics go there)"
    )
