"""Which parallelisms a layout turns on: one small view of the mesh's degrees.

    dims = plan.dims            # ParallelDims(pp=2, dp=4, tp=1, dp_replicate=1)
    if dims.dp_enabled: ...     # instead of `plan.mesh.shape[1] > 1` scattered through the code

The mesh is (pp, dp, tp), tp innermost (:data:`MESH_DIM_NAMES`), as ``init_device_mesh``
lays it out; a strategy may split dp further into (dp_replicate, dp_shard) (HSDP: shards
inside a group, replicas across groups). torchtitan's ``ParallelDims`` is the model.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

MESH_DIM_NAMES = ("pp", "dp", "tp")
"""The mesh's axes, outermost first (the order of ``plan.mesh.shape``)."""


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    pp: int = 1
    dp: int = 1
    tp: int = 1
    dp_replicate: int = 1
    """Groups the model is replicated across (HSDP); dp / dp_replicate shard within a group."""

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans (tp x pp)."""
        return self.tp * self.pp

    def shape(self) -> list[int]:
        """The mesh shape in :data:`MESH_DIM_NAMES` order."""
        return [self.pp, self.dp, self.tp]
