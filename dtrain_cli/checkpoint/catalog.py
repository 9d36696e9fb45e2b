"""The checkpoint folder of a run: names, completeness, verification, ``latest``, pruning.

Torch-free, so ``dtrain checkpoints`` and ``dtrain resume`` can inspect checkpoints
without starting torch. Layout::

    <run>/checkpoints/
      step_000200/          a complete checkpoint: DCP files (.metadata, __<rank>_0.distcp),
                            rng_rank_<k>.safetensors, config.yaml, plan.yaml, meta.json,
                            manifest.json (written last: size + sha256 of every other file)
      latest                the name of the newest complete checkpoint
      .tmp-step_000300-...  a save in progress (or one that crashed): never loaded
      superseded/           newer checkpoints set aside when resuming from an older one

A checkpoint becomes visible only by the rename of its finished temporary folder, after
every rank wrote and the manifest is on disk; so a crash at any point leaves the previous
checkpoint the newest complete one. A checkpoint's config.yaml and plan.yaml keep the run
dir's names (:class:`~dtrain_cli.rundir.layout.RunDir` of the checkpoint folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtrain_cli.rundir import strict_json
from dtrain_cli.rundir.layout import RunDir

STEP_DIR = re.compile(r"^step_(\d{6,})$")
MANIFEST = "manifest.json"
SUPERSEDED = "superseded"
META = "meta.json"
LATEST = "latest"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used or written; the message names the path and the cause."""


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoints_dir(run_dir: Path) -> Path:
    return RunDir(Path(run_dir)).checkpoints


@dataclass
class CheckpointInfo:
    path: Path
    step: int
    complete: bool
    meta: dict[str, Any]
    size_bytes: int


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(path: Path) -> None:
    """Record size and hash of every file in the checkpoint, then fsync it."""
    files = {}
    for f in sorted(p for p in path.iterdir() if p.is_file() and p.name != MANIFEST):
        files[f.name] = {"size": f.stat().st_size, "sha256": sha256_file(f)}
    write_json_durable(path / MANIFEST, {"files": files})


def write_json_durable(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(strict_json.dumps(data, indent=2))  # a loss not measured yet: null
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_file_name(rank: int) -> str:
    """A rank's own file in a checkpoint: its RNG state and the tensors of that rank alone."""
    return f"rng_rank_{rank}.safetensors"


def verify(path: Path, deep: bool = True) -> None:
    """Raise CheckpointError naming the first missing, truncated or corrupted file."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(
            f"{path}: incomplete checkpoint (no {MANIFEST}; the save never finished)"
        )
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{manifest}: unreadable manifest ({exc})") from None
    if ".metadata" not in files:
        raise CheckpointError(f"{path}: manifest lists no DCP .metadata file")
    ranks = read_meta(path).get("rng_ranks", 0)
    if lost := [k for k in range(ranks) if rng_file_name(k) not in files]:
        raise CheckpointError(
            f"{path}: no {rng_file_name(lost[0])} of its {ranks} ranks (rank "
            f"{lost[0]}'s RNG and own state were not saved)"
        )
    for name, entry in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing file of checkpoint {path.name}")
        size = f.stat().st_size
        if size != entry["size"]:
            raise CheckpointError(
                f"{f}: truncated or wrong size ({size} bytes, expected {entry['size']})"
            )
        if deep and sha256_file(f) != entry["sha256"]:
            raise CheckpointError(f"{f}: corrupted (sha256 does not match the manifest)")


def read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / META).read_text())
    except (OSError, ValueError):
        return {}


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def list_checkpoints(run_dir: Path) -> list[CheckpointInfo]:
    """Every ``step_*`` folder, oldest first; ``complete`` = has a manifest (not deep-checked)."""
    root = checkpoints_dir(run_dir)
    out = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir():
            out.append(
                CheckpointInfo(
                    p, int(m.group(1)), (p / MANIFEST).is_file(), read_meta(p), _dir_size(p)
                )
            )
    return sorted(out, key=lambda c: c.step)


def _complete_newest_first(run_dir: Path) -> Iterator[Path]:
    """The checkpoints by step, newest first (each verified by the caller). ``latest`` is
    not asked: a crash between a save's rename and its write of ``latest`` (or a full disk
    at that write) leaves it naming an older one, and a resume then set aside newer work."""
    for info in reversed(list_checkpoints(run_dir)):
        yield info.path


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run has a checkpoint to resume from (not verified: a cheap check)."""
    return next(_complete_newest_first(run_dir), None) is not None


def newest_complete(run_dir: Path, warn: Any = None) -> Path | None:
    """The newest checkpoint that verifies; a broken one is reported through ``warn`` and
    skipped (falls back to the previous complete checkpoint)."""
    for path in _complete_newest_first(run_dir):
        try:
            verify(path)
        except CheckpointError as exc:
            if warn is not None and path.exists():
                warn(f"skipping {path.name}: {exc}")
            continue
        return path
    return None


def run_dir_of(path: Path) -> Path | None:
    """The run dir ``path`` names: itself, the one above its checkpoints/ folder or above
    one of its checkpoints/step_* folders; None when that holds no plan.yaml."""
    run = path
    if STEP_DIR.match(path.name) and path.parent.name == "checkpoints":
        run = path.parent.parent
    elif path.name == "checkpoints":
        run = path.parent
    return run if RunDir(run).plan.is_file() else None


def resolve(ckpt: Path, warn: Any = None) -> tuple[Path, Path]:
    """``--ckpt`` (a run dir, its checkpoints/ folder or one checkpoint folder) -> (run dir,
    verified checkpoint)."""
    ckpt = Path(ckpt)
    if not ckpt.exists():
        raise CheckpointError(f"{ckpt}: no such file or folder")
    if STEP_DIR.match(ckpt.name) and ckpt.parent.name == "checkpoints":
        verify(ckpt)
        return ckpt.parent.parent, ckpt
    if ckpt.name.startswith(".tmp-") and ckpt.parent.name == "checkpoints":
        raise CheckpointError(  # it holds a plan.yaml: it was taken for a run dir
            f"{ckpt}: a checkpoint being written, or left by a save that never finished (not "
            f"complete); give the run dir (its newest complete checkpoint) or a step_<N> folder"
        )
    if (ckpt / MANIFEST).is_file():  # a checkpoint folder, not where a run keeps them
        raise CheckpointError(loose_checkpoint(ckpt))
    if ckpt.name == "checkpoints" and (run := run_dir_of(ckpt)) is not None:
        ckpt = run  # the run's checkpoints/ folder: its newest complete one
    if RunDir(ckpt).plan.is_file() or checkpoints_dir(ckpt).is_dir():
        found = newest_complete(ckpt, warn)
        if found is None:
            raise CheckpointError(f"{ckpt}: no complete checkpoint in {checkpoints_dir(ckpt)}")
        return ckpt, found
    raise CheckpointError(f"{ckpt}: neither a run directory nor a checkpoints/step_* folder")


def loose_checkpoint(ckpt: Path) -> str:
    """Why a checkpoint folder outside its run's checkpoints/ is not taken, and where it
    goes: one an earlier resume set aside (checkpoints/superseded/), or a copy. (It was
    taken for a run dir: "no complete checkpoint in <it>/checkpoints".)"""
    step = read_meta(ckpt).get("step")
    name = step_dir_name(step) if isinstance(step, int) else "step_<N>"
    if ckpt.parent.name == SUPERSEDED and ckpt.parent.parent.name == "checkpoints":
        run = ckpt.parent.parent.parent
        return (
            f"{ckpt}: a checkpoint an earlier resume set aside; to resume or export it, move "
            f"it back as {run / 'checkpoints' / name} (the run's newer ones go aside in turn)"
        )
    return (
        f"{ckpt}: a checkpoint outside a run's checkpoints/ folder; put it in one as "
        f"<run>/checkpoints/{name} (with the run's plan.yaml and config.yaml beside "
        "checkpoints/) to resume or export it"
    )


def publish(tmp: Path, final: Path) -> None:
    """Make a finished temporary checkpoint visible: rename, then point ``latest`` at it."""
    fsync_dir(tmp)
    if final.exists():  # the same step written again (e.g. after a restart): replace it
        old = final.with_name(f".old-{final.name}-{time.time_ns()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)
    latest_tmp = final.parent / f".{LATEST}.tmp"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, final.parent / LATEST)
    fsync_dir(final.parent)


def prune(
    run_dir: Path, keep_last: int, keep: Path | None = None, attempt: str | None = None
) -> list[Path]:
    """Delete complete checkpoints beyond the newest ``keep_last`` and stale temporaries.
    Called only after a newer checkpoint (``keep``) is complete, so the last good one is
    never lost. A temporary of this ``attempt`` for a later step is a save other ranks are
    writing now (an async save finished at the next one's start): it stays."""
    root = checkpoints_dir(run_dir)
    complete = [c.path for c in list_checkpoints(run_dir) if c.complete]
    doomed = complete[: max(0, len(complete) - keep_last)]
    doomed = [p for p in doomed if p != keep]
    named = STEP_DIR.match(keep.name) if keep is not None else None
    published = int(named.group(1)) if named else None
    doomed += [
        p for p in root.glob(".tmp-*") if p.is_dir() and not _in_flight(p.name, attempt, published)
    ]
    doomed += [p for p in root.glob(".old-*") if p.is_dir()]
    if published is not None:  # a prune killed half-way left one without its manifest
        doomed += [
            c.path
            for c in list_checkpoints(run_dir)
            if not c.complete and c.step < published and c.path != keep
        ]
    for p in doomed:
        # renamed first: a prune killed in rmtree leaves an .old-* (removed by the next),
        # not a step folder without its manifest that `dtrain checkpoints` calls broken
        gone = p
        if STEP_DIR.match(p.name):
            with contextlib.suppress(OSError):
                gone = p.rename(root / f".old-{p.name}-{uuid.uuid4().hex[:8]}")
        shutil.rmtree(gone, ignore_errors=True)
    return doomed


def drop_temporaries(root: Path, *, keep: str) -> list[Path]:
    """At a run's first save, before any save of it is in flight: remove every partial
    save but ``keep`` (the folder this save's ranks are writing now). An earlier attempt's
    (a crashed rank's, a full disk's) is never loaded, and on a full disk it kept the disk
    full until the next publish; a multi-node run launched again has the same attempt label
    as the one that crashed, so the label does not tell them apart."""
    doomed = [p for p in root.glob(".tmp-*") if p.is_dir() and p.name != keep]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _in_flight(name: str, attempt: str | None, published: int | None) -> bool:
    """``.tmp-step_<N>-<attempt>``: this attempt's save of a step after the published one."""
    m = re.fullmatch(r"\.tmp-step_(\d+)-(.+)", name)
    if m is None or attempt is None or published is None:
        return False
    return m.group(2) == attempt and int(m.group(1)) > published


def set_aside_newer(run_dir: Path, step: int) -> list[Path]:
    """Resuming from an older checkpoint: move newer ones to ``checkpoints/superseded/`` so
    automatic recovery cannot jump back to them. Nothing is deleted."""
    moved = []
    target = checkpoints_dir(run_dir) / SUPERSEDED
    for info in list_checkpoints(run_dir):
        if info.step > step:
            target.mkdir(exist_ok=True)
            dest = target / f"{info.path.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(info.path, dest)
            moved.append(dest)
    latest = checkpoints_dir(run_dir) / LATEST
    if moved and latest.exists():
        latest.write_text(step_dir_name(step) + "\n")
    return moved


SET_ASIDE_SUFFIX = len("-20261205-072600")


def put_back(run_dir: Path, moved: list[Path]) -> None:
    """Undo :func:`set_aside_newer` for a resume that trained nothing: the checkpoints in
    their places again, ``latest`` the newest of them (a failed resume had hidden them, and
    the next ``dtrain resume`` of the run started from the older one)."""
    for dest in moved:
        original = checkpoints_dir(run_dir) / dest.name[:-SET_ASIDE_SUFFIX]
        if dest.is_dir() and not original.exists():
            os.replace(dest, original)
    newest = max((c.step for c in list_checkpoints(run_dir) if c.complete), default=None)
    latest = checkpoints_dir(run_dir) / LATEST
    if moved and newest is not None and latest.exists():
        latest.write_text(step_dir_name(newest) + "\n")
