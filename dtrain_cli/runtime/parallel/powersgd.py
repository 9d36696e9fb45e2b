"""PowerSGD (``comm.compression=powersgd``) whose state survives a resume bit for bit.

    dtrain launch recipe=gpt_small dp=4 comm.compression=powersgd comm.powersgd_rank=4

torch's ``powerSGD_hook`` keeps its per-rank state per DDP *bucket*: the error feedback as
one flat buffer in the bucket's gradient order, and the warm-started low-rank P and Q of
its matrices, laid out in the order the hook meets them. DDP lays buckets out twice: the
first iteration in the model's parameter order, later in the order gradients became ready.
A resumed run starts in the first layout while the saved state was in the second, so the
saved buffers would land on the wrong parameters. :class:`PowerSGDHook` calls torch's hook
and keeps the state laid out per *parameter* in between: whenever a bucket's layout
differs from the one its buffers were written in, the buffers are rebuilt for the new one.
A checkpoint keeps the per-parameter form (:meth:`rank_state`), so it does not depend on
either layout.
"""

from typing import Any

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

Buffers = dict[str, dict[str, torch.Tensor]]
"""kind (error, p, q) -> parameter name -> its part of the kind's flat buffer."""
KINDS = ("error", "p", "q")


class PowerSGDHook:
    """A DDP communication hook: torch's PowerSGD with layout-independent state."""

    def __init__(self, state: Any, names: dict[int, str]) -> None:
        self.state = state
        self.names = names  # id(parameter) -> its name in the model
        self.layouts: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        self.pending: Buffers | None = None  # per parameter, until every bucket is re-laid
        self.__name__ = self.__qualname__ = "powerSGD_hook"  # what DDP logs and checks

    def __call__(self, state, bucket):  # no annotations: DDP checks them by identity
        index = bucket.index()
        layout = [(self.names[id(p)], tuple(p.shape)) for p in bucket.parameters()]
        if self.layouts.get(index) != layout:
            if self.pending is None:
                self.pending = self.per_parameter()
            self._lay_out(index, layout, self.pending)
        if bucket.is_last():
            self.pending = None  # every bucket of this iteration is in its new layout
        return powerSGD_hook.powerSGD_hook(state, bucket)

    # -- the per-parameter form ---------------------------------------------------------------
    def per_parameter(self) -> Buffers:
        """Every bucket's buffers, cut into their parameters' parts."""
        out: Buffers = {kind: {} for kind in KINDS}
        for index, layout in self.layouts.items():
            for kind, table in zip(KINDS, self._tables(), strict=True):
                if index in table:
                    out[kind].update(self._cut(kind, table[index], layout))
        return out

    def _tables(self) -> tuple[dict, dict, dict]:
        s = self.state
        return s.error_dict, s.p_memory_dict, s.q_memory_dict

    def _spans(self, kind: str, layout: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, int]]:
        """(name, length) of each parameter's part of a ``kind`` buffer, in buffer order:
        the error follows the bucket; P and Q follow torch's hook (compressed matrices,
        grouped by shape in the order shapes first appear)."""
        if kind == "error":
            return [(name, int(np.prod(shape))) for name, shape in layout]
        groups: dict[tuple[int, int], list[str]] = {}
        for name, shape in layout:
            n, m = shape[0], int(np.prod(shape[1:])) if len(shape) > 1 else 1
            r = min(n, m, self.state.matrix_approximation_rank)
            compress, _, _ = powerSGD_hook._should_compress(
                n, m, r, self.state.min_compression_rate
            )
            if compress:
                groups.setdefault((n, m), []).append(name)
        spans = []
        for (n, m), names in groups.items():
            r = min(n, m, self.state.matrix_approximation_rank)
            spans += [(name, (n if kind == "p" else m) * r) for name in names]
        return spans

    def _cut(
        self, kind: str, flat: torch.Tensor, layout: list[tuple[str, tuple[int, ...]]]
    ) -> dict[str, torch.Tensor]:
        out, at = {}, 0
        for name, length in self._spans(kind, layout):
            out[name] = flat[at : at + length].clone()
            at += length
        return out

    def _lay_out(
        self, index: int, layout: list[tuple[str, tuple[int, ...]]], parts: Buffers
    ) -> None:
        """This bucket's buffers in its current layout, from the per-parameter parts (a
        kind none of whose parts exist yet is left for torch's hook to create)."""
        for kind, table in zip(KINDS, self._tables(), strict=True):
            spans = self._spans(kind, layout)
            have = parts[kind]
            if spans and all(name in have for name, _ in spans):
                table[index] = torch.cat([have[name] for name, _ in spans])
            else:
                table.pop(index, None)
        self.layouts[index] = layout

    # -- checkpoints ---------------------------------------------------------------------------
    def rank_state(self, prefix: str) -> dict[str, torch.Tensor]:
        """The iteration, the counters, the random generator and the per-parameter buffers."""
        s = self.state
        parts = self.pending if self.pending is not None else self.per_parameter()
        out = {
            f"{prefix}iter": torch.tensor([s.iter], dtype=torch.int64),
            f"{prefix}numel": torch.tensor(
                [s.total_numel_before_compression, s.total_numel_after_compression],
                dtype=torch.int64,
            ),
        }
        for kind in KINDS:
            for name, tensor in parts[kind].items():
                out[f"{prefix}{kind}.{name}"] = tensor.detach().cpu().contiguous()
        _, key, pos, has_gauss, gauss = s.rng.get_state()
        out[f"{prefix}rng_key"] = torch.from_numpy(np.asarray(key, dtype=np.int64))
        out[f"{prefix}rng_pos"] = torch.tensor([pos, has_gauss], dtype=torch.int64)
        out[f"{prefix}rng_gauss"] = torch.tensor([gauss], dtype=torch.float64)
        return out

    def load_rank_state(self, saved: dict[str, torch.Tensor]) -> None:
        """The inverse of :meth:`rank_state`: laid out bucket by bucket at first use."""
        s = self.state
        s.iter = int(saved["iter"][0])
        before, after = (int(v) for v in saved["numel"])
        s.total_numel_before_compression, s.total_numel_after_compression = before, after
        parts: Buffers = {kind: {} for kind in KINDS}
        for key, tensor in saved.items():
            kind, _, name = key.partition(".")
            if kind in parts and name:
                parts[kind][name] = tensor.clone()
        for table in self._tables():
            table.clear()
        self.layouts.clear()
        self.pending = parts
        pos, has_gauss = (int(v) for v in saved["rng_pos"])
        key = saved["rng_key"].numpy().astype(np.uint32)
        s.rng.set_state(("MT19937", key, pos, has_gauss, float(saved["rng_gauss"][0])))
