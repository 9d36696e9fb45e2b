"""The model seam: what the plan, the parallelisms, the loop and export need from a model.

    dtrain plan recipe=gpt_small tp=2 pp=2          # facts + problems (torch-free for built-ins)
    dtrain launch model=custom model._target_=my_models.net.Net dp=2

One :class:`ModelSpec` subclass per model kind (``model.kind``: gpt, cnn_bn, custom, hf),
the way torchtitan's ``TrainSpec`` bundles a model with its ``parallelize_fn``. A spec
holds the typed model config of its kind and answers two sets of questions:

- for the plan (no torch import for the built-in kinds): :meth:`facts` (parameters, layers,
  FLOPs, activation bytes) and :meth:`problems` (divisibility by tp, layers by stages, what
  the model cannot do);
- for the runtime (these import torch): :meth:`build`, :meth:`loss`, :meth:`fsdp_units`,
  :meth:`apply_tensor_parallel`, :meth:`pipeline_stage` and :meth:`export`.

Nothing outside ``dtrain_cli/models`` knows a model's field names.
"""

from __future__ import annotations

import contextlib
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # torch only for type checkers: the plan imports this module
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from dtrain_cli.config.schema import DtrainConfig


class StageSpan(Protocol):
    """What a model needs to know of a pipeline stage (the plan's ``StagePlan`` is one)."""

    layers: list[int]
    """[first, last + 1) of the model's blocks on this stage."""
    embeddings: bool
    head: bool


@dataclass(kw_only=True)
class TensorShape:
    """One parameter as a model kind describes it without building it (``dtrain simulate``'s
    exact per-rank counts)."""

    name: str
    shape: tuple[int, ...]
    where: str | int
    """``first`` (embeddings), ``last`` (final norm, head) or the block index."""
    tp_dim: int | None = None
    """The dimension tensor parallel splits (None: replicated under tp, or not known)."""


def places(names: list[str]) -> list[str | int]:
    """Where each parameter (by qualified name, in model order) sits for a pipeline: the
    block index (the first ``.N.`` in its name), ``first`` before any block, ``last`` after."""
    out: list[str | int] = []
    seen_block = False
    for name in names:
        m = re.search(r"\.(\d+)\.", name)
        seen_block = seen_block or m is not None
        out.append(int(m.group(1)) if m else ("last" if seen_block else "first"))
    return out


def param_shapes(
    model: nn.Module, tp_dim: Callable[[str], int | None] = lambda name: None
) -> list[TensorShape]:
    """Every parameter of a built model (a meta build) as a :class:`TensorShape`: its
    shape, its pipeline place and the dimension ``tp_dim(name)`` says tensor parallel
    splits (None: not split, or not known)."""
    named = list(model.named_parameters())
    where = places([name for name, _ in named])
    return [
        TensorShape(name=name, shape=tuple(p.shape), where=w, tp_dim=tp_dim(name))
        for (name, p), w in zip(named, where, strict=True)
    ]


def tensor_sizes(model: nn.Module) -> list[tuple[int, int, str | int]]:
    """(numel, dims, place) of every parameter of a built model (``ModelFacts.tensor_sizes``)."""
    named = list(model.named_parameters())
    where = places([name for name, _ in named])
    return [(p.numel(), p.dim(), w) for (_, p), w in zip(named, where, strict=True)]


def whole_by_place(
    model: nn.Module, is_whole: Callable[[str, str], bool], tied_once: bool = False
) -> list[tuple[str | int, int]]:
    """(place, parameters) of a built model's parameters that ``is_whole(module name,
    parameter name)`` says every tp rank holds whole (``ModelFacts.tp_replicated_places``);
    a tied parameter counts at each place it sits (as each pipeline stage holds its copy),
    or at its first only (``tied_once``: the model's own count)."""
    named = list(model.named_parameters(remove_duplicate=tied_once))
    out: dict[str | int, int] = {}
    for (name, p), where in zip(named, places([n for n, _ in named]), strict=True):
        module, _, pname = name.rpartition(".")
        if is_whole(module, pname):
            out[where] = out.get(where, 0) + p.numel()
    return list(out.items())


def param_rows(model: nn.Module) -> list[tuple[int, int, int | None]]:
    """(dim 0, numel, None) of a built model's parameters, those of one dim 0 together
    (``ModelFacts.param_rows``: FSDP2's padding per element is the same within a group; the
    tp dim is not known)."""
    rows: dict[int, int] = {}
    for p in model.parameters():
        if p.dim():
            rows[p.shape[0]] = rows.get(p.shape[0], 0) + p.numel()
    return [(dim0, numel, None) for dim0, numel in rows.items()]


@dataclass(kw_only=True)
class ModelFacts:
    """What the plan computes with. Counts are of the model the runtime builds."""

    num_params: int
    num_layers: int = 0
    """Repeated blocks: what pipeline stages split, checkpointing recomputes and FSDP wraps
    (0: none found). Whether stages can split them: :meth:`ModelSpec.pipeline_splittable`."""
    params_per_layer: int = 0
    """Parameters of one block (also the largest FSDP unit the plan adds as gathered)."""
    params_first: int = 0
    """Parameters before the blocks (embeddings): on the first pipeline stage."""
    params_last: int = 0
    """Parameters after the blocks (final norm, head): on the last pipeline stage."""
    tokens_per_sample: int = 1
    """Sequence length for token models; 1 for models whose samples are not token sequences."""
    unit: str = "tokens"
    """What throughput counts: tokens (language models) or samples (everything else)."""
    flops_per_unit: int = 0
    """Forward + backward FLOPs per token (or per sample), for MFU."""
    params_tp_replicated: int = 0
    """Parameters every tp rank holds whole (norms, biases after a row-wise split...)."""
    tp_replicated_places: list[tuple[str | int, int]] = field(default_factory=list)
    """(place, parameters every tp rank holds whole there): ``first``, a block index or
    ``last``, as :func:`places` names them (a tied weight at each of its places, as each
    pipeline stage holds its copy); empty when the kind does not say (a pipeline stage's
    share of ``params_tp_replicated`` is then taken in proportion to its parameters)."""
    matrix_shapes: list[tuple[int, int]] = field(default_factory=list)
    """2-D weights (what PowerSGD compresses); the rest of num_params is in other tensors."""
    batchnorm_layers: int = 0
    """BatchNorm modules: at dp > 1 each normalizes its rank's slice of the batch unless
    ``parallel.sync_batchnorm`` is on."""
    param_rows: list[tuple[int, int, int | None]] = field(default_factory=list)
    """(dim 0, numel, the dim tp splits or None) of every parameter, or of every group of
    parameters with the same dim 0 and tp dim (numel summed): FSDP2 pads each tensor's dim 0
    to a multiple of its shard group (``plan.memory.fsdp_padding``). Empty: unknown."""
    score_elements: int = 0
    """Attention scores one sample's forward writes out, over all blocks (heads x s x s
    each): an unfused attention (``model.attention=math``) moves them through memory,
    which the step time charges; 0 for a fused kernel (flash attention) that keeps them
    on chip."""
    tensor_sizes: list[tuple[int, int, str | int]] = field(default_factory=list)
    """(numel, dims, place) of every parameter in model order; place as
    :attr:`TensorShape.where`. ZeRO-1 hands out whole tensors (``strategies.zero1``), so a
    large embedding can outweigh a rank's even share. Empty: unknown."""


class ModelSpec(ABC):
    """One model kind. ``cfg`` is the kind's typed config (``config_class``)."""

    kind: ClassVar[str]
    config_class: ClassVar[type]

    def __init__(self, cfg: Any, run: DtrainConfig | None = None) -> None:
        self.cfg = cfg
        self.run = run
        """The whole run's config, for kinds whose layout options live outside ``model``."""

    # -- plan (torch-free for the built-in kinds) ----------------------------------------------
    @property
    def name(self) -> str:
        """What the plan and summaries call the model."""
        return str(getattr(self.cfg, "name", None) or self.kind)

    @abstractmethod
    def facts(self) -> ModelFacts: ...

    def activation_bytes(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """(per block, outside the blocks) activation bytes kept for backward, one micro-batch
        (the loss included): what autograd saves, as ``SavedTensorMeter`` measures it."""
        return 0.0, 0.0

    def first_stage_bytes(self, micro_batch: int) -> float:
        """Of :meth:`activation_bytes`' bytes outside the blocks, those a pipeline's first
        stage keeps (the embedding's input); the last stage keeps the rest. Default 0: a
        kind that does not say books them all on the last."""
        return 0.0

    def autocast_extra_bytes(self, micro_batch: int, tp: int) -> tuple[float, float]:
        """(per block, outside) bytes that autocast over fp32 parameters (DDP, ZeRO-1 at
        bf16/fp16) keeps beyond :meth:`activation_bytes` at 2 bytes a value: the residual
        stream stays fp32 and each matmul saves its own low-precision copy of its input.
        Default 0: not modelled for this kind."""
        return 0.0, 0.0

    def checkpoint_bytes(self, micro_batch: int, bytes_per_value: int, tp: int) -> float:
        """Bytes a checkpointed block keeps for backward: its input (the rest is recomputed).
        Default: the block's whole activations (a kind that does not say gets no saving)."""
        return self.activation_bytes(micro_batch, bytes_per_value, tp)[0]

    def activations_estimated(self) -> bool:
        """False when :meth:`activation_bytes` knows nothing (0): the plan says "not
        estimated" and the advisor does not rank on them."""
        return True

    def sharding_problems(self, cfg: DtrainConfig) -> list[str]:
        """What FSDP cannot shard of this model as configured (the plan asks where the
        strategy shards parameters)."""
        return []

    def warnings(self, cfg: DtrainConfig) -> list[str]:
        """What the plan says of this model with this config and lets it run."""
        return []

    def cpu_differences(self) -> list[str]:
        """What this model saves differently on CPU tensors than on CUDA, which the plan
        counts (``dtrain simulate`` of a CUDA plan says it beside its table)."""
        return []

    def value_problems(self) -> list[str]:
        """The model's own values out of range (checked before anything computes with them)."""
        return []

    def problems(self, cfg: DtrainConfig) -> list[str]:
        """What this model cannot do with this config: one line per problem (key=value: why)."""
        out = []
        if cfg.parallel.tp > 1 and not self.supports_tensor_parallel():
            out.append(
                f"parallel.tp={cfg.parallel.tp}: model.kind={self.kind} has no tensor-parallel "
                f"plan{self.tp_hint()}"
            )
        if cfg.parallel.pp > 1 and not self.pipeline_splittable():
            out.append(
                f"parallel.pp={cfg.parallel.pp}: model.kind={self.kind} cannot be split into "
                f"pipeline stages{self.pp_hint()}"
            )
        return out

    def pipeline_splittable(self) -> bool:
        """Whether pipeline stages can split the model's layers (its facts count them)."""
        return bool(self.facts().num_layers)

    def layers_label(self, num_layers: int) -> str:
        """How pipeline errors name the model's layer count (the key that sets it)."""
        return f"the model's layers ({num_layers})"

    reads_fsdp_units: ClassVar[bool] = False
    """Whether ``parallel.fsdp_units`` (class names to wrap) chooses this kind's FSDP units;
    the others wrap their own blocks (model=hf: ``_no_split_modules``), and the plan warns
    that the key is not read."""

    vocab_key: ClassVar[str] = "model.vocab_size"
    """The key that sets this kind's vocabulary (what the plan's vocabulary warning names:
    ``config.data_warnings.data_warnings``)."""

    def supports_tensor_parallel(self) -> bool:
        return False

    def tp_hint(self) -> str:
        return "; use tp=1"

    def pp_hint(self) -> str:
        return "; use pp=1"

    @property
    def block_size(self) -> int | None:
        """Tokens per training window for token data (None: the model takes no token data)."""
        return getattr(self.cfg, "block_size", None)

    @property
    def vocab_size(self) -> int | None:
        return getattr(self.cfg, "vocab_size", None)

    def default_loss(self) -> str:
        """``train.loss=auto`` means this: cross_entropy | mse | model."""
        return "cross_entropy"

    def config_dict(self) -> dict[str, Any]:
        """The config as it is written to ``config.yaml`` (and read back by the workers)."""
        from dataclasses import asdict

        return asdict(self.cfg)

    def worker_modules(self) -> list[str]:
        """Modules the workers import to build this model, for the fork server to import
        once before it forks them (:mod:`dtrain_cli.launch.preload`; optional, a speed-up)."""
        return []

    # -- runtime (imports torch) ---------------------------------------------------------------
    def fake_tensor_context(self) -> contextlib.AbstractContextManager:
        """What this kind's forward needs to take, under torch's ``FakeTensorMode``, the path
        it takes on real tensors (``dtrain simulate --compute fake``, the plan's
        measurements). Default: nothing."""
        return contextlib.nullcontext()

    @abstractmethod
    def build(self, device: torch.device | str) -> nn.Module:
        """The full model, initialised from the global RNG (the caller seeds it). On the meta
        device for estimates."""

    def loss(self, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """The model's default loss on (outputs, targets); ``train.loss`` can replace it."""
        from dtrain_cli.models.losses import cross_entropy

        return cross_entropy(outputs, targets)

    def forward_loss(self, model: nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """``train.loss=model``: the model's ``forward(inputs, targets)`` computes the loss."""
        from dtrain_cli.models.losses import model_loss

        return model_loss(model(inputs, targets))

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """Modules FSDP shards as one unit each (blocks), before the root."""
        from dtrain_cli.models.units import largest_module_list

        return largest_module_list(model)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The repeated blocks (compile units)."""
        return self.fsdp_units(model)

    def apply_tensor_parallel(self, model: nn.Module, tp_mesh: DeviceMesh) -> None:
        raise NotImplementedError(f"model.kind={self.kind}: no tensor-parallel plan")

    def pipeline_stage(self, model: nn.Module, stage: StageSpan) -> nn.Module:
        """The part of the full ``model`` that pipeline stage ``stage`` runs."""
        raise NotImplementedError(f"model.kind={self.kind}: cannot be split into stages")

    def export(self, model: nn.Module, out: Path, fmt: str) -> list[Path]:
        """Write the trained (plain, non-distributed) model; returns the files written."""
        from dtrain_cli.models.export import save_safetensors

        if fmt != "safetensors":
            raise ValueError(f"--format {fmt}: model.kind={self.kind} exports only as safetensors")
        return save_safetensors(model, out, self.config_dict())
