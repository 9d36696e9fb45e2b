"""This rank's batches through ``torch.utils.data.DataLoader``, in global-stream order.

    dtrain launch recipe=gpt_tiny data.num_workers=2 data.prefetch_factor=4

A batch sampler (:class:`StreamBatches`) yields exactly the index lists the global sample
stream (:mod:`.data`) assigns to this rank, micro-step after micro-step from the step the
run starts or resumes at; the loader only decides *where* items are read (``data.num_workers``
processes, ``data.prefetch_factor`` batches ahead each, pinned memory on CUDA), never which.
So the worker count changes nothing in the loss curve and a resume is exact. Built-in
sources (token windows, shapes) are read a whole micro-batch at a time
(``__getitems__``); a ``data=custom`` dataset item by item and collated by torch's
``default_collate``. The trainer only asks for the next micro-batch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate
from torch.utils.data._utils.pin_memory import pin_memory

from dtrain_cli.config.schema import DataConfig
from dtrain_cli.runtime.data.stream import BatchLayout, SampleStream


class WindowBatches:
    """A built-in source (``pairs(indices)``) read one micro-batch per fetch."""

    def __init__(self, windows: Any) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.windows.pairs(np.asarray(indices, dtype=np.int64))
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([i])


def already_batched(batch: Any) -> Any:
    return batch


class StreamBatches:
    """Batch sampler: this rank's micro-batch indices from ``(step, micro_step)`` onwards."""

    def __init__(self, stream: SampleStream, layout: BatchLayout, step: int, micro: int) -> None:
        self.stream, self.layout, self.step, self.micro = stream, layout, step, micro

    def __iter__(self) -> Iterator[list[int]]:
        step, k, size = self.step, self.micro, self.layout.micro_batch_size
        while True:
            yield self.stream.indices(self.layout.micro_start(step, k), size).tolist()
            k += 1
            if k == self.layout.grad_accum:
                step, k = step + 1, 0


def _to_device(batch: Any, device: torch.device, pin: bool) -> Any:
    if isinstance(batch, torch.Tensor):
        if device.type == "cpu":
            return batch
        return batch.to(device, non_blocking=pin)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, pin) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(v, device, pin) for v in batch)
    return batch


def _cat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, dict):
        return {k: _cat([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_cat([p[i] for p in parts]) for i in range(len(first)))
    return first


def as_pair(batch: Any) -> tuple[Any, Any]:
    """``(inputs, targets)``: a pair as it is; a dict as itself with its ``targets`` (or
    ``labels``) entry as the targets, None when it has neither."""
    if isinstance(batch, dict):
        return batch, batch.get("targets", batch.get("labels"))
    inputs, targets = batch
    return inputs, targets


class Batches:
    """This rank's micro-batches of the global sample stream (see :mod:`.data`)."""

    def __init__(
        self,
        source: Any,
        layout: BatchLayout,
        seed: int,
        device: torch.device,
        data: DataConfig | None = None,
    ) -> None:
        data = data or DataConfig()
        batched = hasattr(source, "pairs")
        self.dataset = WindowBatches(source) if batched else source
        self.collate = already_batched if batched else default_collate
        self.layout = layout
        self.stream = SampleStream(len(source), seed)
        self.seed = seed
        self.device = device
        self.pin = device.type == "cuda"
        self.num_workers = data.num_workers
        self.prefetch_factor = data.prefetch_factor
        self.wait_s = 0.0
        """Time the training loop spent getting batches (reported per step in the summary)."""
        self._iter: Iterator[Any] | None = None
        self._next: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def _start(self, step: int, micro_step: int) -> None:
        """(Re)start the loader at ``(step, micro_step)``: at the first call and on resume.
        Without worker processes the batches are read here, as torch's single-process
        loader reads them (the same fetch, collate and pinning), without its per-batch
        machinery: a step of a small model is mostly fixed cost."""
        self.close()
        sampler = StreamBatches(self.stream, self.layout, step, micro_step)
        if not self.num_workers:
            self._iter = map(self._read, sampler)
            return
        loader = DataLoader(
            self.dataset,
            batch_sampler=sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor,
            pin_memory=self.pin,
            # fork: workers are children of this rank and exit when it dies (a forkserver,
            # the default in a forkserver-started rank, would outlive a killed rank)
            multiprocessing_context="fork" if self.num_workers else None,
            # the loader draws its workers' seeds from this, not from the global RNG
            generator=torch.Generator().manual_seed(self.seed),
        )
        self._iter = iter(loader)

    def _read(self, indices: list[int]) -> Any:
        """One batch in this process: what ``DataLoader(num_workers=0)`` returns for it."""
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(indices) if getitems else [self.dataset[i] for i in indices]
        batch = self.collate(items)
        return pin_memory(batch) if self.pin else batch

    def micro_batch(self, step: int, micro_step: int) -> tuple[Any, Any]:
        t0 = time.perf_counter()
        if self._next != (step, micro_step) or self._iter is None:
            self._start(step, micro_step)
        assert self._iter is not None
        batch = next(self._iter)
        k = micro_step + 1
        self._next = (step + 1, 0) if k == self.layout.grad_accum else (step, k)
        out = as_pair(_to_device(batch, self.device, self.pin))
        self.wait_s += time.perf_counter() - t0
        return out

    def micro_batches(self, step: int, first: int, count: int) -> tuple[Any, Any]:
        """Micro-steps ``first .. first+count-1`` concatenated (one pipeline call)."""
        parts = [self.micro_batch(step, k) for k in range(first, first + count)]
        return _cat([p[0] for p in parts]), _cat([p[1] for p in parts])

    def fetch(self, indices: np.ndarray) -> tuple[Any, Any]:
        """The items at ``indices``, on the device, read here (validation batches)."""
        if isinstance(self.dataset, WindowBatches):
            batch = self.dataset.__getitems__(indices.tolist())
        else:
            batch = self.collate([self.dataset[int(i)] for i in indices])
        if self.pin:
            batch = _pin(batch)
        return as_pair(_to_device(batch, self.device, self.pin))

    def leave_out_step(self) -> None:
        """From here on every step reads one step further in the stream: the window of the
        step about to run is never trained on (the ``drop`` drill: the reference run of
        ``train.on_nan=skip``/``rollback``, as if that window were cut from the data)."""
        shift = self.layout.global_batch
        self.layout = dataclasses.replace(
            self.layout, base_samples=self.layout.base_samples + shift
        )
        self.close()

    def close(self) -> None:
        """Stop the loader's worker processes (if any)."""
        shutdown = getattr(self._iter, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._iter, self._next = None, None


def _pin(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_pin(v) for v in batch)
    return batch
