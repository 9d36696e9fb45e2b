"""Your own ``nn.Module``: ``model=custom model._target_=pkg.module.Class`` (+ its kwargs).

    dtrain launch model=custom model._target_=my_models.net.Net model.width=256 \
        data=custom data._target_=my_models.net.Pairs train.loss=mse dp=2

The other keys under ``model`` are the class's keyword arguments (Hydra's ``instantiate``
semantics: a nested ``_target_`` builds a nested object). The class is imported from the
current directory, the ``--config-dir`` folders and ``PYTHONPATH`` (``run.import_roots``,
the same on every worker and node). The plan builds the model once on the meta device for
its counts, which costs a torch import (the built-in models keep a torch-free plan).

Layouts: FSDP wraps ``parallel.fsdp_units`` (class names) or, by default, the children of
the model's largest ``nn.ModuleList``; tensor parallel follows ``parallel.tp_plan``
(``parallelize_module`` patterns); pipeline stages split an ``nn.Sequential`` model, or
the list named by ``pipeline.layers`` with ``pipeline.first``/``pipeline.last`` modules on
the first and last stage (the stage then runs first -> its layers -> last, in order).
"""

from __future__ import annotations

import functools
import json
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dtrain_cli.models.spec import ModelFacts, ModelSpec

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig

TP_STYLES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence")
_SAVED: dict[str, Any] = {}
"""Saved-for-backward bytes of one sample by model, loss and layer list (:meth:`_saved`)."""


@dataclass(kw_only=True)
class CustomModelConfig:
    kind: str = "custom"
    target: str = ""
    """``_target_``: the dotted path of the ``nn.Module`` class (or a function returning one)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Every other key under ``model``: the constructor's keyword arguments."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CustomModelConfig:
        """Every key but ``kind`` and ``_target_`` is an argument; ``kwargs.<name>`` is the
        same argument (the form ``data.kwargs.<name>`` takes: one convention for both)."""
        data = dict(data)
        data.pop("kind", None)
        target = str(data.pop("_target_", "") or "")
        nested = data.pop("kwargs", None)
        if isinstance(nested, dict):
            data = {**data, **nested}
        elif nested is not None:
            data["kwargs"] = nested  # a class's own argument named kwargs
        return cls(target=target, kwargs=data)

    @property
    def name(self) -> str:
        return self.target.rsplit(".", 1)[-1] or "custom"

    @property
    def block_size(self) -> int | None:
        """For token data: the ``block_size`` keyword, when the class takes one."""
        return self.kwargs.get("block_size")

    @property
    def vocab_size(self) -> int | None:
        return self.kwargs.get("vocab_size")


class CustomSpec(ModelSpec):
    kind = "custom"
    config_class = CustomModelConfig
    cfg: CustomModelConfig

    def config_dict(self) -> dict[str, Any]:
        return {"kind": "custom", "_target_": self.cfg.target, **self.cfg.kwargs}

    @property
    def name(self) -> str:
        return self.cfg.name

    # -- plan -----------------------------------------------------------------------------
    def problems(self, cfg: DtrainConfig) -> list[str]:
        from dtrain_cli.targets import argument_key_problems

        if typos := argument_key_problems(self.cfg.kwargs, "model"):
            return typos
        if not self.cfg.target:
            return [
                "model._target_: not set; name your nn.Module class, "
                "e.g. model._target_=my_pkg.net.Net"
            ]
        try:
            self.meta_model()
            out = super().problems(cfg)  # counts the layers: may find pipeline.* wrong
        except ValueError as exc:
            return [str(exc)]
        plan = cfg.parallel.tp_plan or {}
        bad = {k: v for k, v in plan.items() if v not in TP_STYLES}
        if bad:
            out.append(
                f"parallel.tp_plan: unknown style {', '.join(f'{k}={v}' for k, v in bad.items())}; "
                f"choose one of {', '.join(TP_STYLES)}"
            )
        if cfg.parallel.fsdp_units and not self._named_units(self.meta_model()):
            out.append(
                f"parallel.fsdp_units={list(cfg.parallel.fsdp_units)}: no module of those classes "
                f"in {self.cfg.target}"
            )
        return out

    def supports_tensor_parallel(self) -> bool:
        return bool(self.run and self.run.parallel.tp_plan)

    def tp_hint(self) -> str:
        return '; give one with parallel.tp_plan={"blocks.*.fc1": colwise, "blocks.*.fc2": rowwise}'

    def pp_hint(self) -> str:
        return (
            ": it is not an nn.Sequential; name its layer list with pipeline.layers=<attribute> "
            "(and pipeline.first / pipeline.last for the modules before and after it)"
        )

    @functools.cache  # noqa: B019 - one spec per plan; the model is its own meta build
    def meta_model(self) -> Any:
        """The model built on the meta device (no memory), for counts and checks."""
        import torch

        with torch.device("meta"):
            return self._instantiate()

    def facts(self) -> ModelFacts:
        model = self.meta_model()
        params = [p for p in model.parameters()]
        n = sum(p.numel() for p in params)
        mats = [tuple(p.shape) for p in params if p.dim() == 2]
        layers = self._layer_list(model)
        per_layer = max((sum(p.numel() for p in m.parameters()) for m in layers), default=0)
        first = sum(p.numel() for m in self._ends(model, "first") for p in m.parameters())
        last = sum(p.numel() for m in self._ends(model, "last") for p in m.parameters())
        seq = self.cfg.block_size or 1
        return ModelFacts(
            num_params=n,
            num_layers=len(layers),
            params_per_layer=per_layer,
            params_first=first,
            params_last=last,
            tokens_per_sample=seq,
            unit="tokens" if self.cfg.block_size else "samples",
            flops_per_unit=6 * n,
            matrix_shapes=mats,  # type: ignore[arg-type]
            batchnorm_layers=_count_batchnorm(model),
        )

    # -- activations: measured once, on meta ----------------------------------------------
    def _saved(self) -> Any:
        """:class:`.saved_bytes.SavedBytes` of one sample, or None when dtrain cannot form
        one (``data=custom``: the inputs are your dataset's) or the forward fails on meta.
        Measured once per model, loss and data (the advisor plans many layouts of one)."""
        run = self.run
        seq = self.cfg.block_size
        if run is None or not seq or run.data.source in ("custom", "shapes"):
            return None
        key = json.dumps(
            [self.cfg.target, self.cfg.kwargs, run.train.loss, run.pipeline.layers],
            sort_keys=True,
            default=str,
        )
        if key not in _SAVED:
            _SAVED[key] = self._measure_saved(int(seq))
        return _SAVED[key]

    def _measure_saved(self, seq: int) -> Any:
        run = self.run
        assert run is not None
        import torch

        from dtrain_cli.models.losses import model_loss, resolve_loss
        from dtrain_cli.models.saved_bytes import measure_saved

        loss = self.default_loss() if run.train.loss == "auto" else run.train.loss
        x = torch.zeros(1, seq, dtype=torch.long, device="meta")
        try:
            loss_fn = resolve_loss(loss, list(run.run.import_roots)) or self.loss

            def forward_loss(model: Any, inputs: Any) -> Any:
                if loss == "model":
                    return model_loss(model(inputs, inputs))
                return loss_fn(model(inputs), inputs)

            model = self.meta_model()
            return measure_saved(model, self._layer_list(model), x, forward_loss)
        except Exception:  # the user's forward on meta, their loss: then not estimated
            return None

    def activations_estimated(self) -> bool:
        return self._saved() is not None

    def activation_bytes(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """Measured for one sample (:meth:`_saved`), times the micro-batch; floating-point
        tensors at ``bytes_per_value``; 0 when not estimated (the plan says so)."""
        s = self._saved()
        if s is None:
            return 0.0, 0.0
        return s.per_micro_batch(micro_batch, bytes_per_value, tp)

    def checkpoint_bytes(self, micro_batch: int, bytes_per_value: int, tp: int) -> float:
        s = self._saved()
        if s is None or not s.block_input:
            return super().checkpoint_bytes(micro_batch, bytes_per_value, tp)
        return s.block_input * micro_batch * bytes_per_value / 4

    # -- runtime ----------------------------------------------------------------------------
    def _instantiate(self) -> Any:
        """Hydra's ``instantiate`` on the model node, after every ``_target_`` in it passed
        the checked resolver (it imports, it is not the standard library)."""
        from hydra.errors import InstantiationException
        from hydra.utils import instantiate
        from torch import nn

        from dtrain_cli.targets import TargetError, resolve_target

        roots = list(self.run.run.import_roots) if self.run else []
        try:
            for key, dotted in _targets(self.cfg.kwargs, "model"):
                resolve_target(dotted, key=f"{key}._target_", roots=roots)
            resolve_target(self.cfg.target, key="model._target_", roots=roots)
        except TargetError as exc:
            raise ValueError(str(exc)) from None
        for root in reversed(roots):  # instantiate imports by itself: the same path
            if root not in sys.path:
                sys.path.insert(0, root)
        try:
            model = instantiate({"_target_": self.cfg.target, **self.cfg.kwargs}, _convert_="all")
        except InstantiationException as exc:
            reason = str(exc.__cause__ or exc).strip().splitlines()[-1]
            raise ValueError(f"model._target_={self.cfg.target}: {reason}") from None
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"model._target_={self.cfg.target}: returned {type(model).__name__}, "
                f"not a torch.nn.Module"
            )
        return model

    def build(self, device: Any) -> Any:
        import torch

        with torch.device(device):
            return self._instantiate()

    def default_loss(self) -> str:
        return "cross_entropy"

    def _named_units(self, model: Any) -> list[Any]:
        from dtrain_cli.models.units import modules_named

        names = list(self.run.parallel.fsdp_units or []) if self.run else []
        return modules_named(model, names) if names else []

    def fsdp_units(self, model: Any) -> list[Any]:
        if self.run and self.run.parallel.fsdp_units:
            return self._named_units(model)
        return super().fsdp_units(model)

    def apply_tensor_parallel(self, model: Any, tp_mesh: Any) -> None:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        styles = {
            "colwise": ColwiseParallel,
            "rowwise": RowwiseParallel,
            "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
            "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
            "sequence": SequenceParallel,
        }
        plan = dict(self.run.parallel.tp_plan or {}) if self.run else {}
        present = {name for name, _ in model.named_modules()}
        plan = {k: v for k, v in plan.items() if _matches_any(k, present)}  # stage may lack some
        parallelize_module(model, tp_mesh, {k: styles[v]() for k, v in plan.items()})

    # -- pipeline ---------------------------------------------------------------------------
    def _layer_attr(self) -> str | None:
        return self.run.pipeline.layers if self.run else None

    def _layer_list(self, model: Any) -> list[Any]:
        from torch import nn

        attr = self._layer_attr()
        if attr:
            layers = getattr(model, attr, None)
            if not isinstance(layers, nn.ModuleList | nn.Sequential | nn.ModuleDict):
                raise ValueError(
                    f"pipeline.layers={attr}: {self.cfg.target} has no nn.ModuleList/Sequential "
                    f"attribute {attr!r}"
                )
            return list(layers.children())
        if isinstance(model, nn.Sequential):
            return list(model.children())
        return []

    def _ends(self, model: Any, which: str) -> list[Any]:
        names = getattr(self.run.pipeline, which) if self.run else []
        out = []
        for name in names or []:
            module = getattr(model, name, None)
            if module is None:
                raise ValueError(f"pipeline.{which}: {self.cfg.target} has no module {name!r}")
            out.append(module)
        return out

    def pipeline_stage(self, model: Any, stage: Any) -> Any:
        import copy
        from collections import OrderedDict

        from torch import nn

        lo, hi = stage.layers
        part = copy.deepcopy(model)
        attr = self._layer_attr()
        if not attr:  # an nn.Sequential: keep the stage's children under their own indices
            kept = OrderedDict(
                (k, m) for i, (k, m) in enumerate(part.named_children()) if lo <= i < hi
            )
            return nn.Sequential(kept)
        layers = list(getattr(part, attr).children())
        # a ModuleDict keyed by the original index keeps the full model's parameter names
        setattr(part, attr, nn.ModuleDict({str(i): layers[i] for i in range(lo, hi)}))
        first = list(self.run.pipeline.first) if stage.embeddings else []
        last = list(self.run.pipeline.last) if stage.head else []
        for name in set(self.run.pipeline.first) - set(first):
            setattr(part, name, None)
        for name in set(self.run.pipeline.last) - set(last):
            setattr(part, name, None)

        def forward(self: nn.Module, x: Any) -> Any:
            for name in first:
                x = getattr(self, name)(x)
            for layer in getattr(self, attr).values():
                x = layer(x)
            for name in last:
                x = getattr(self, name)(x)
            return x

        part.forward = types.MethodType(forward, part)
        return part


def _matches_any(pattern: str, names: set[str]) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def _targets(value: Any, key: str) -> list[tuple[str, str]]:
    """(config key, dotted path) of every nested ``_target_`` under ``value``."""
    out: list[tuple[str, str]] = []
    if isinstance(value, dict):
        if "_target_" in value:
            out.append((key, str(value["_target_"])))
        for k, v in value.items():
            out += _targets(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _targets(v, f"{key}[{i}]")
    return out


def _count_batchnorm(model: Any) -> int:
    from torch.nn.modules.batchnorm import _BatchNorm

    return sum(isinstance(m, _BatchNorm) for m in model.modules())
