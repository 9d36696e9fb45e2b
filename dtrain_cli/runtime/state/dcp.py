"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), sync or async.

    dtrain launch recipe=gpt_tiny dp=2 checkpoint.every_steps=50 checkpoint.async_save=true

Every rank writes its own shards in parallel; ``get_state_dict``/``set_state_dict`` give
layout-independent names, so a checkpoint saved with one layout loads into another (DCP
reshards). Saved: model, optimizer, LR-scheduler position, grad scaler, step, samples and
tokens seen, and each rank's RNG states (a ``safetensors`` file per rank: no pickles).
Non-tensor optimizer entries DCP stores as bytes are read back with ``weights_only=True``
(:mod:`.safe_load`). The folder becomes visible only when complete
(:mod:`dtrain_cli.checkpoint.catalog`). DCP itself is imported at the first save or load.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from dtrain_cli.checkpoint import catalog
from dtrain_cli.checkpoint.catalog import CheckpointError
from dtrain_cli.rundir import env
from dtrain_cli.runtime.diagnostics import faults

log = logging.getLogger("dtrain")


RANK_STATE = "rank_state."
"""Prefix of a rank's own tensors in its ``rng_rank_<k>.safetensors`` (PowerSGD's error
feedback...): per rank, so not in the DCP state dict, which dedups equal keys."""


def dcp_errors() -> tuple[type[BaseException], ...]:
    """What a DCP call can raise: any Exception, and DCP's own ``CheckpointException``,
    which is a BaseException. ``torch.distributed.checkpoint`` is imported at the first save
    or load, not before the first step (about 0.7 s)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def rng_state() -> dict[str, torch.Tensor]:
    np_state = np.random.get_state()
    py_state = random.getstate()
    out = {
        "torch_cpu": torch.get_rng_state(),
        "numpy_key": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
        "numpy_pos": torch.tensor([np_state[2], np_state[3]], dtype=torch.int64),
        "numpy_gauss": torch.tensor([np_state[4]], dtype=torch.float64),
        "python": torch.tensor(list(py_state[1]), dtype=torch.int64),
        "python_meta": torch.tensor([py_state[0], 0 if py_state[2] is None else 1]),
        "python_gauss": torch.tensor([py_state[2] or 0.0], dtype=torch.float64),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"cuda_{i}"] = s
    return out


def set_rng_state(s: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(s["torch_cpu"])
    pos, has_gauss = (int(v) for v in s["numpy_pos"])
    np.random.set_state(
        (
            "MT19937",
            s["numpy_key"].numpy().astype(np.uint32),
            pos,
            has_gauss,
            float(s["numpy_gauss"][0]),
        )
    )
    version, has_py_gauss = (int(v) for v in s["python_meta"])
    gauss = float(s["python_gauss"][0]) if has_py_gauss else None
    random.setstate((version, tuple(int(v) for v in s["python"]), gauss))
    cuda = [s[k] for k in sorted(k for k in s if k.startswith("cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def root_cause(exc: BaseException, path: Path) -> str:
    """One line for DCP's per-rank CheckpointException: the first OS error of any rank
    (a full disk can surface as another error on the rank that hit it second)."""
    failures = getattr(exc, "failures", None)
    errors = [exc]
    if isinstance(failures, dict) and failures:
        errors = [f[0] if isinstance(f, tuple) else f for _, f in sorted(failures.items())]
    for err in errors:
        if isinstance(err, OSError):
            return str(err.strerror or err)
    try:
        if shutil.disk_usage(path).free < (1 << 20):
            return "No space left on device"
    except OSError:
        pass
    first = errors[0]
    return (str(first).splitlines() or [type(first).__name__])[0][:300]


def agreed_attempt() -> str:
    """This attempt's label, rank 0's on every rank: it names the save's temporary folder,
    which every rank writes into. Each node's agent counts its own restarts, so after an
    elastic node joined, the nodes' counts differed and each wrote its own folder (rank 0
    published one without the other node's shards)."""
    attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}-{env.restart_count()}"
    if dist.is_initialized() and dist.get_world_size() > 1 and dist.get_backend() != "fake":
        box = [attempt]
        dist.broadcast_object_list(box, src=0)
        attempt = str(box[0])
    return attempt


RNG_FILE_WAIT_S = 5.0
"""How long rank 0 looks again for another rank's RNG file before refusing to publish."""


def _unseen_rng_files(tmp: Path, ranks: int) -> list[int]:
    """The ranks whose RNG file rank 0 does not see in ``tmp``, looked for again for up to
    :data:`RNG_FILE_WAIT_S` (a shared file system may show another node's new file late)."""
    deadline = time.monotonic() + RNG_FILE_WAIT_S
    while True:
        lost = [k for k in range(ranks) if not (tmp / catalog.rng_file_name(k)).is_file()]
        if not lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.5)


class CheckpointManager:
    """Save / load / retention for one run. Every rank calls ``save`` at the same step."""

    def __init__(self, run_dir: Path, rank: int, keep_last: int, async_save: bool) -> None:
        self.run_dir = run_dir
        self.root = catalog.checkpoints_dir(run_dir)
        self.rank = rank
        self.keep_last = keep_last
        self.async_save = async_save
        self.attempt = agreed_attempt()
        self._pending: tuple[Future, Path, Path, dict[str, Any]] | None = None
        # async saves run their collectives on their own gloo group, off the training stream
        self._pg = dist.new_group(backend="gloo") if async_save else None
        self._stager: Any = None
        """The async saves' staging buffers (:mod:`.staging`), made at the first."""
        self._swept = False
        """Whether rank 0 removed earlier attempts' partial saves (at the first save)."""
        self.rng_rank = rank
        """The rank whose saved RNG state this one resumes with (its tp group's first)."""
        self.last_save_time = time.monotonic()
        self.save_stall_s: list[float] = []

    # -- saving ----------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: dict[str, Any],
        meta: dict[str, Any],
        files: dict[str, str],
        rank_state: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Write checkpoint ``step``. ``files``: small text files rank 0 puts beside it;
        ``rank_state``: tensors of this rank alone (beside its RNG state)."""
        started = time.perf_counter()
        self.wait()  # at most one save in flight
        final = self.root / catalog.step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}-{self.attempt}"
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        if self.rank == 0 and not self._swept:  # a crashed attempt's partial save: space back
            catalog.drop_temporaries(self.root, keep=tmp.name)
            self._swept = True
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            own = {f"{RANK_STATE}{k}": v.contiguous() for k, v in (rank_state or {}).items()}
            save_file({**rng_state(), **own}, str(tmp / catalog.rng_file_name(self.rank)))
            faults.maybe_fail("kill_in_save", step=step, rank=self.rank)
            faults.slow_save(step, self.rank)
            if self.async_save:
                # the save plan is reused across saves (the layout does not change), so the
                # stall is staging the CPU copy, not planning collectives every time
                writer = dcp.FileSystemWriter(str(tmp), sync_files=True, overwrite=True)
                future = dcp.async_save(
                    state,
                    storage_writer=writer,
                    process_group=self._pg,
                    planner=DefaultSavePlanner(enable_plan_caching=True),
                    async_stager=self._staging_buffers(),
                )
                self._pending = (future, tmp, final, {"meta": meta, "files": files})
            else:
                writer = dcp.FileSystemWriter(str(tmp), sync_files=True, overwrite=True)
                dcp.save(state, storage_writer=writer)
                self._finish(tmp, final, meta, files)
        except dcp_errors() as exc:
            raise self._failed(tmp, exc) from None
        self.save_stall_s.append(time.perf_counter() - started)
        self.last_save_time = time.monotonic()

    def _staging_buffers(self) -> Any:
        if self._stager is None:
            from dtrain_cli.runtime.state.staging import ReusedBuffers

            self._stager = ReusedBuffers()
        return self._stager

    def poll(self) -> None:
        """At a step boundary: publish a finished async save."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        future, tmp, final, extra = self._pending
        self._pending = None
        try:
            future.result()
            self._finish(tmp, final, extra["meta"], extra["files"])
        except dcp_errors() as exc:
            raise self._failed(tmp, exc) from None

    def _failed(self, tmp: Path, exc: BaseException) -> CheckpointError:
        """The save failed on every rank (DCP gathers its writes' errors): rank 0 removes the
        partial folder, which is never loaded and kept a full disk full; not one whose
        ``meta.json`` says it is complete (its publish failed: it may be the only copy)."""
        cause = root_cause(exc, tmp)
        if self.rank == 0 and not (tmp / catalog.META).exists():
            shutil.rmtree(tmp, ignore_errors=True)
        removed = " (the partial save is removed)" if not tmp.exists() else ""
        return CheckpointError(f"cannot write checkpoint {tmp}: {cause}{removed}")

    def _finish(self, tmp: Path, final: Path, meta: dict[str, Any], files: dict[str, str]) -> None:
        """Rank 0, once every rank's shards and DCP's metadata are on disk."""
        if self.rank != 0:
            return
        for name, text in files.items():
            (tmp / name).write_text(text)
        ranks = dist.get_world_size() if dist.is_initialized() else 1  # each wrote its RNG
        if lost := _unseen_rng_files(tmp, ranks):
            raise CheckpointError(  # pods without a shared claim: rank 0 saw its own files only
                f"rank {lost[0]}'s files are not in it (every rank saved; this node does not "
                "see them): the nodes do not share the run directory; give them one (on "
                "Kubernetes cluster.pvc=CLAIM, ReadWriteMany)"
            )
        catalog.write_json_durable(
            tmp / catalog.META,
            {**meta, "complete": True, "saved_at": time.time(), "rng_ranks": ranks},
        )
        catalog.write_manifest(tmp)
        catalog.publish(tmp, final)
        pruned = catalog.prune(self.run_dir, self.keep_last, keep=final, attempt=self.attempt)
        log.info(
            "checkpoint %s saved%s",
            final.name,
            f" (pruned {', '.join(p.name for p in pruned)})" if pruned else "",
        )

    # -- loading -----------------------------------------------------------------------------
    def load(self, path: Path, state: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Load into ``state`` in place (DCP reshards to this layout); returns this rank's
        own tensors (``rank_state`` of the save; empty when the world size changed)."""
        import torch.distributed.checkpoint as dcp

        from dtrain_cli.checkpoint.safe_load import SafeLoadPlanner

        try:
            dcp.load(
                state, storage_reader=dcp.FileSystemReader(str(path)), planner=SafeLoadPlanner()
            )
        except dcp_errors() as exc:
            raise CheckpointError(
                f"{path}: cannot be loaded into this model/layout "
                f"({str(exc).splitlines()[0][:300]})"
            ) from exc
        rng_file = path / catalog.rng_file_name(self.rank)
        if not rng_file.is_file():
            log.info(
                "no RNG state for rank %d in %s (world size changed): seeded anew",
                self.rank,
                path.name,
            )
            return {}
        saved = load_file(str(rng_file))
        shared = path / catalog.rng_file_name(self.rng_rank)  # a layout changed at one size
        set_rng_state(load_file(str(shared)) if shared.is_file() else saved)
        return {k[len(RANK_STATE) :]: v for k, v in saved.items() if k.startswith(RANK_STATE)}

    def close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._pg is not None:
            dist.destroy_process_group(self._pg)
            self._pg = None
