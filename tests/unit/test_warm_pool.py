"""The warm worker pool's key and when a launch asks for it (dtrain_cli/launch/warm_pool.py);
launches served by a pool are in tests/launch/test_warm_pool.py."""

from __future__ import annotations

import pytest

from dtrain_cli import source_stats
from dtrain_cli.launch import warm_pool


def test_the_key_follows_dtrain_code_and_what_torch_reads_at_import(monkeypatch, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "worker.py").write_text("x = 1\n")
    monkeypatch.setattr(source_stats, "CODE_ROOT", tmp_path / "pkg")
    monkeypatch.delenv("TORCH_SHOW_CPP_STACKTRACES", raising=False)
    key = warm_pool.pool_key()
    monkeypatch.setenv("DTRAIN_LAUNCH_T0", "123.0")  # a launch's own, not read at import
    monkeypatch.setenv("MASTER_PORT", "29512")
    assert warm_pool.pool_key() == key
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")  # torch reads it at import
    assert warm_pool.pool_key() != key
    monkeypatch.delenv("TORCH_SHOW_CPP_STACKTRACES")
    assert warm_pool.pool_key() == key
    (tmp_path / "pkg" / "worker.py").write_text("x = 22\n")  # dtrain's code edited
    assert warm_pool.pool_key() != key


def test_launches_ask_for_a_pool_unless_told_not_or_in_a_scheduler_job(monkeypatch):
    for name in ("DTRAIN_WARM_POOL", "SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert warm_pool.wanted()
    for off in ("0", "off", "false"):
        monkeypatch.setenv("DTRAIN_WARM_POOL", off)
        assert not warm_pool.wanted()
    monkeypatch.setenv("DTRAIN_WARM_POOL", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert not warm_pool.wanted()


def test_one_slot_per_checkout_and_python_in_a_private_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("DTRAIN_WARM_POOL_DIR", str(tmp_path / "pools"))
    where = warm_pool.slot()
    assert where.parent == tmp_path / "pools"
    assert (where.parent.stat().st_mode & 0o777) == 0o700
    monkeypatch.setenv("DTRAIN_CACHE", str(tmp_path / "other-cache"))  # the same pool
    assert warm_pool.slot() == where
    assert len(f"{where}.sock") < 108  # a socket's path limit


def test_the_pool_folder_is_this_users_alone(monkeypatch, tmp_path):
    """A folder others may enter is closed to them; a link is refused (the launch then
    starts its own server)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o775)
    shared.chmod(0o775)
    monkeypatch.setenv("DTRAIN_WARM_POOL_DIR", str(shared))
    warm_pool.slot()
    assert (shared.stat().st_mode & 0o777) == 0o700
    (tmp_path / "link").symlink_to(shared)
    monkeypatch.setenv("DTRAIN_WARM_POOL_DIR", str(tmp_path / "link"))
    with pytest.raises(OSError, match="not a folder of this user's"):
        warm_pool.slot()
