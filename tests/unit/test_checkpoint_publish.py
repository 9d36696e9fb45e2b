"""Rank 0 publishes a checkpoint only when it sees every rank's files
(dtrain_cli/runtime/state/dcp.py, ``CheckpointManager._finish``)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import dtrain_cli.runtime.state.dcp as dcp_state
from dtrain_cli.checkpoint import catalog


def test_a_node_that_does_not_see_the_other_ranks_files_does_not_publish(tmp_path, monkeypatch):
    """Two pods without a shared claim: pod 0 logged 'checkpoint step_000002 saved' and
    pointed latest at it, with rank 1's shards and RNG state in pod 1's own folder."""
    monkeypatch.setattr(dcp_state, "agreed_attempt", lambda: "local-0")  # no group to ask
    monkeypatch.setattr(dcp_state.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dcp_state.dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(dcp_state, "RNG_FILE_WAIT_S", 0.6)  # looked for again, then refused
    manager = dcp_state.CheckpointManager(tmp_path, rank=0, keep_last=3, async_save=False)
    tmp = manager.root / ".tmp-step_000002-local-0"
    final = manager.root / "step_000002"
    tmp.mkdir(parents=True)
    save_file({"x": torch.zeros(1)}, str(tmp / "rng_rank_0.safetensors"))
    (tmp / ".metadata").write_bytes(b"")
    with pytest.raises(catalog.CheckpointError) as err:
        manager._finish(tmp, final, {"step": 2}, {})
    assert str(err.value) == (  # the save's error names the folder: 'cannot write ...: '
        "rank 1's files are not in it (every rank saved; this node does not see them): the "
        "nodes do not share the run directory; give them one (on Kubernetes "
        "cluster.pvc=CLAIM, ReadWriteMany)"
    )
    assert not final.exists() and not (manager.root / catalog.LATEST).exists()
    save_file({"x": torch.zeros(1)}, str(tmp / "rng_rank_1.safetensors"))  # shared: published
    manager._finish(tmp, final, {"step": 2}, {})
    assert final.is_dir() and catalog.read_meta(final)["rng_ranks"] == 2


def test_a_failed_save_and_a_crashed_attempts_partial_save_are_removed(tmp_path, monkeypatch):
    """A full disk during a save left its partial folder, which kept the disk full: the next
    resume's first save failed for want of the space it held (a user's find)."""
    import torch.distributed.checkpoint as dcp

    monkeypatch.setattr(dcp_state, "agreed_attempt", lambda: "local-1")
    manager = dcp_state.CheckpointManager(tmp_path, rank=0, keep_last=3, async_save=False)
    crashed = manager.root / ".tmp-step_000004-local-0"  # the attempt before, killed mid-save
    relaunched = manager.root / ".tmp-step_000006-local-1"  # a multi-node run's label again
    for folder in (crashed, relaunched):
        folder.mkdir(parents=True)
        (folder / "__0_0.distcp").write_bytes(b"x" * 1000)
    real_save = dcp.save

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp, "save", full_disk)
    state = {"w": torch.arange(4.0)}
    with pytest.raises(catalog.CheckpointError) as err:
        manager.save(2, state, {"step": 2}, {})
    tmp = manager.root / ".tmp-step_000002-local-1"
    assert str(err.value) == (
        f"cannot write checkpoint {tmp}: No space left on device (the partial save is removed)"
    )
    assert sorted(p.name for p in manager.root.iterdir()) == []  # every partial save gone
    monkeypatch.setattr(dcp, "save", real_save)
    manager.save(3, state, {"step": 3}, {})
    assert sorted(p.name for p in manager.root.iterdir()) == ["latest", "step_000003"]


def test_a_rank_resumes_with_its_tp_groups_rng_and_keeps_its_own_tensors(tmp_path, monkeypatch):
    """The tp ranks of a replica draw dropout alike (seeded by the group's first rank); a
    resume restored each rank's own RNG file, so a layout changed at one world size (dp=2 ->
    tp=2) gave the new tp pair different streams (a review's find)."""
    import torch.distributed.checkpoint as dcp

    monkeypatch.setattr(dcp_state, "agreed_attempt", lambda: "local-0")
    ckpt = tmp_path / "step_000002"
    dcp.save({"w": torch.zeros(2)}, checkpoint_id=str(ckpt), no_dist=True)
    for rank in (0, 1):
        torch.manual_seed(100 + rank)
        own = {f"{dcp_state.RANK_STATE}mine": torch.tensor([float(rank)])}
        save_file({**dcp_state.rng_state(), **own}, str(ckpt / catalog.rng_file_name(rank)))
    manager = dcp_state.CheckpointManager(tmp_path, rank=1, keep_last=3, async_save=False)
    manager.rng_rank = 0  # rank 1 is tp rank 1 of the group whose first rank is 0
    mine = manager.load(ckpt, {"w": torch.ones(2)})
    torch.manual_seed(100)
    assert torch.equal(torch.rand(3), _draw_after(manager, ckpt))
    assert mine["mine"].item() == 1.0  # its own tensors are still its own


def _draw_after(manager, ckpt):
    manager.load(ckpt, {"w": torch.ones(2)})
    return torch.rand(3)


def test_a_prune_killed_half_way_leaves_nothing_that_looks_broken(tmp_path, monkeypatch):
    """A SIGKILL during the prune of an old checkpoint left step_000006 without its manifest
    forever: past keep_last, and `dtrain checkpoints` exited 1 on every later call (a new
    user's find). A pruned folder is renamed first; one left half-deleted by an older
    prune is removed once a newer checkpoint is complete."""
    import json
    import shutil

    root = catalog.checkpoints_dir(tmp_path)

    def checkpoint(step: int, complete: bool = True) -> None:
        path = root / catalog.step_dir_name(step)
        path.mkdir(parents=True)
        (path / "meta.json").write_text(json.dumps({"step": step, "complete": True}))
        if complete:
            (path / catalog.MANIFEST).write_text("{}")

    checkpoint(2, complete=False)  # what a killed prune of an older version left
    for step in (4, 6, 8):
        checkpoint(step)
    real = shutil.rmtree

    def killed(path, *args, **kwargs):  # the manifest goes first, then the SIGKILL
        (path / catalog.MANIFEST).unlink(missing_ok=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):  # killed in the first rmtree
        catalog.prune(tmp_path, keep_last=2, keep=root / "step_000008")
    monkeypatch.setattr(shutil, "rmtree", real)
    # renamed first: what the kill left is no step folder without its manifest
    assert [(c.step, c.complete) for c in catalog.list_checkpoints(tmp_path)] == [
        (2, False), (6, True), (8, True)
    ]  # fmt: skip
    catalog.prune(tmp_path, keep_last=2, keep=root / "step_000008")
    assert [c.step for c in catalog.list_checkpoints(tmp_path)] == [6, 8]
    assert sorted(p.name for p in root.iterdir()) == ["step_000006", "step_000008"]
