"""Your own ``nn.Module``: ``model=custom model._target_=pkg.module.Class`` (+ its kwargs).

    dtrain launch model=custom model._target_=my_models.net.Net model.width=256 \
        data=custom data._target_=my_models.net.Pairs train.loss=mse dp=2

The other keys under ``model`` are the class's keyword arguments (Hydra's ``instantiate``
semantics: a nested ``_target_`` builds a nested object). The class is imported from the
current directory, the ``--config-dir`` folders and ``PYTHONPATH`` (``run.import_roots``,
the same on every worker and node). The plan builds the model once on the meta device for
its counts, which costs a torch import (the built-in models keep a torch-free plan); what it
measured is kept in the data cache (:mod:`.record`), so planning it again builds nothing.

Layouts: FSDP wraps ``parallel.fsdp_units`` (class names) or, by default, the children of
the model's largest ``nn.ModuleList``; tensor parallel follows ``parallel.tp_plan``
(``parallelize_module`` patterns); pipeline stages split an ``nn.Sequential`` model, or
the list named by ``pipeline.layers`` with ``pipeline.first``/``pipeline.last`` modules on
the first and last stage (the stage then runs first -> its layers -> last, in order).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import dtrain_cli.models.custom.stages as stages
from dtrain_cli.models.custom.checks import (
    build_failure,
    measured_problems,
    measured_warnings,
    tied_unit_problems,
    window_problems,
)
from dtrain_cli.models.custom.measure import count_batchnorm, forward_loss_for, saved_records
from dtrain_cli.models.custom.record import FOLDER, record_key, source_files, sources_unchanged
from dtrain_cli.models.custom.tp_layout import (
    apply_tp_plan,
    tp_plan_hint,
    tp_plan_problems,
    tp_replicated,
    tp_whole_by_place,
    tp_whole_modules,
)
from dtrain_cli.models.records import cache_root, load, store
from dtrain_cli.models.saved_bytes import autocast_extra_bytes, low_precision_bytes
from dtrain_cli.models.spec import ModelFacts, ModelSpec, param_rows, tensor_sizes
from dtrain_cli.targets import nested_targets

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig

_RECORDS: dict[str, dict[str, Any]] = {}
"""This process's records by key (``dtrain advise`` plans dozens of layouts of one model)."""


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
    reads_fsdp_units = True
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
        if windows := window_problems(self.cfg.target, self.cfg.kwargs, cfg):
            return windows
        try:
            measured = self._measured
            out = super().problems(cfg)  # counts the layers: may find pipeline.* wrong
        except ValueError as exc:
            return [str(exc)]
        out += measured_problems(self.cfg.target, measured, cfg, self._layer_attr())
        plan = dict(cfg.parallel.tp_plan or {})
        out += tp_plan_problems(self.meta_model, plan, cfg.parallel.tp, self.cfg.target)
        if cfg.parallel.fsdp_units and not set(cfg.parallel.fsdp_units) & set(
            measured["module_classes"]
        ):
            out.append(
                f"parallel.fsdp_units={list(cfg.parallel.fsdp_units)}: no module of those classes "
                f"in {self.cfg.target}"
            )
        return out

    def sharding_problems(self, cfg: DtrainConfig) -> list[str]:
        return tied_unit_problems(self._measured.get("tied_owners", []), cfg)

    def warnings(self, cfg: DtrainConfig) -> list[str]:
        try:
            return measured_warnings(self.cfg.target, self._measured, self.cfg.block_size)
        except ValueError:  # does not build: a problem already
            return []

    def supports_tensor_parallel(self) -> bool:
        return bool(self.run and self.run.parallel.tp_plan)

    def tp_hint(self) -> str:
        return tp_plan_hint(self)  # in the model's own names

    def pp_hint(self) -> str:
        return stages.pp_hint(self.meta_model())

    @functools.cache  # noqa: B019 - one spec per plan; the model is its own meta build
    def meta_model(self) -> Any:
        """The model built on the meta device (no memory), for counts and checks."""
        import torch

        with torch.device("meta"):
            return self._instantiate()

    # -- plan: measured once on the meta device, then kept (:mod:`.record`) ------------------
    @functools.cached_property
    def _key(self) -> str | None:
        """The record's key (None without a run config: tests' bare specs measure anew)."""
        run = self.run
        if run is None:
            return None
        pipe = run.pipeline
        options = [self.cfg.target, self.cfg.kwargs, run.data.source, run.train.loss]
        options.append(sorted(self._tp_plan().items()))
        options += [pipe.layers, list(pipe.first or []), list(pipe.last or [])]
        options.append(list(run.parallel.fsdp_units or []))  # the blocks when no layers named
        fields = ["unstaged", "tied", "tied_owners", "trainable"]  # beside the facts
        return record_key([*options, list(run.run.import_roots), *fields])

    @functools.cached_property
    def _measured(self) -> dict[str, Any]:
        """The facts, the saved bytes of one sample and the module class names: the data
        cache's record when its sources are unchanged, else measured on a meta build (and
        recorded when it can be). Once per spec. ValueError: the model cannot be built or
        its layer list named."""
        key = self._key
        if key is not None and key in _RECORDS:
            return _RECORDS[key]
        if key is not None:
            known = load(cache_root(self.run), key, FOLDER)
            if known is not None and sources_unchanged(known.get("sources")):
                _RECORDS[key] = known
                return known
        model = self.meta_model()
        saved, complete = self._saved_records()
        measured = {
            "facts": asdict(self._count(model)),
            "pipeline_layers": len(self._layer_list(model)),
            "unstaged": stages.unstaged_modules(model, self._layer_attr(), *self._end_names()),
            "tied": stages.tied_across_stages(model, self._layer_attr()),
            "tied_owners": stages.tied_owners(model),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "frozen": sum(p.numel() for p in model.parameters() if not p.requires_grad),
            **saved,
            "module_classes": sorted({type(m).__name__ for m in model.modules() if m is not model}),
        }
        sources = source_files(self._roots(), self._target_paths()) if key and complete else None
        if key is None or sources is None:  # not recordable: kept by this spec only
            return measured
        measured["sources"] = sources
        store(cache_root(self.run), key, measured, FOLDER)
        _RECORDS[key] = measured
        return measured

    def _roots(self) -> list[str]:
        return list(self.run.run.import_roots) if self.run else []

    def _target_paths(self) -> list[str]:
        """The dotted paths the measurement imported: the model, nested targets, the loss."""
        paths = [self.cfg.target, *(d for _, d in nested_targets(self.cfg.kwargs, "model"))]
        loss = self.run.train.loss if self.run else ""
        return paths + ([loss] if "." in loss else [])

    def facts(self) -> ModelFacts:
        f = dict(self._measured["facts"])
        f["matrix_shapes"] = [tuple(x) for x in f.get("matrix_shapes", [])]
        f["param_rows"] = [tuple(x) for x in f.get("param_rows", [])]
        f["tensor_sizes"] = [tuple(x) for x in f.get("tensor_sizes", [])]
        f["tp_replicated_places"] = [tuple(x) for x in f.get("tp_replicated_places", [])]
        return ModelFacts(**f)

    def _count(self, model: Any) -> ModelFacts:
        params = [p for p in model.parameters()]
        n = sum(p.numel() for p in params)
        mats = [tuple(p.shape) for p in params if p.dim() == 2]
        layers = self._blocks(model)
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
            batchnorm_layers=count_batchnorm(model),
            tensor_sizes=tensor_sizes(model),
            param_rows=param_rows(model),
            params_tp_replicated=tp_replicated(model, self._tp_plan()),
            tp_replicated_places=tp_whole_by_place(model, self._tp_plan()),
        )

    # -- activations: measured once, on fake CPU tensors (:mod:`.measure`) --------------
    def _saved(self) -> Any:
        """:class:`.saved_bytes.SavedBytes` of one sample in fp32, or None (no token windows,
        or the forward failed); measured once per model, loss and data (:meth:`_measured`)."""
        from dtrain_cli.models.saved_bytes import SavedBytes

        try:
            saved = self._measured["saved"]
        except ValueError:
            return None
        return SavedBytes(**saved) if saved is not None else None

    def _saved_records(self) -> tuple[dict[str, Any], bool]:
        """(:func:`.measure.saved_records`, complete?): nothing by design (the inputs are
        your dataset's) is complete; a loss that does not resolve is not."""
        run, seq = self.run, self.cfg.block_size
        if run is None or not seq or run.data.source in ("custom", "shapes"):
            return {"saved": None}, True
        loss = self.default_loss() if run.train.loss == "auto" else run.train.loss
        try:
            forward_loss = forward_loss_for(loss, list(run.run.import_roots), self.loss)
        except Exception:  # the loss did not resolve: not estimated
            return {"saved": None}, False
        return saved_records(
            block_size=int(seq),
            forward_loss=forward_loss,
            build=self._instantiate,
            meta_model=self.meta_model,
            layer_list=self._blocks,
            tp_whole=lambda model: tp_whole_modules(model, self._tp_plan()),
        )

    def activations_estimated(self) -> bool:
        return self._saved() is not None

    def activation_bytes(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """Measured for one sample (:meth:`_saved`), times the micro-batch: at bf16 as
        measured under autocast with bf16 parameters where that ran, else floating-point
        tensors scaled to ``bytes_per_value``; 0 when not estimated (the plan says so)."""
        s = self._saved()
        if s is None:
            return 0.0, 0.0
        low = low_precision_bytes(self._measured, micro_batch, tp) if bytes_per_value < 4 else None
        return low if low is not None else s.per_micro_batch(micro_batch, bytes_per_value, tp)

    def autocast_extra_bytes(self, micro_batch: int, tp: int) -> tuple[float, float]:
        """Measured: what autocast over fp32 parameters saves beyond bf16 parameters; 0
        where the forward did not run under fake tensors."""
        return autocast_extra_bytes(self._measured, micro_batch, tp)

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
            for key, dotted in nested_targets(self.cfg.kwargs, "model"):
                resolve_target(dotted, key=key, roots=roots)
            resolve_target(self.cfg.target, key="model._target_", roots=roots)
        except TargetError as exc:
            raise ValueError(str(exc)) from None
        for root in reversed(roots):  # instantiate imports by itself: the same path
            if root not in sys.path:
                sys.path.insert(0, root)
        try:
            model = instantiate({"_target_": self.cfg.target, **self.cfg.kwargs}, _convert_="all")
        except InstantiationException as exc:
            raise ValueError(build_failure(self.cfg.target, self.cfg.kwargs, exc)) from None
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
        apply_tp_plan(model, tp_mesh, self._tp_plan())

    def _tp_plan(self) -> dict[str, str]:
        return dict(self.run.parallel.tp_plan or {}) if self.run else {}

    # -- pipeline ---------------------------------------------------------------------------
    def _layer_attr(self) -> str | None:
        return self.run.pipeline.layers if self.run else None

    def pipeline_splittable(self) -> bool:
        return bool(self._measured.get("pipeline_layers"))

    def _blocks(self, model: Any) -> list[Any]:
        """The blocks the plan counts, checkpoints and splits activations by: the pipeline's
        layer list, else what FSDP and checkpointing wrap (:meth:`fsdp_units`)."""
        return self._layer_list(model) or self.fsdp_units(model)

    def _layer_list(self, model: Any) -> list[Any]:
        return stages.layer_list(model, self._layer_attr(), self.cfg.target)

    def _ends(self, model: Any, which: str) -> list[Any]:
        names = getattr(self.run.pipeline, which) if self.run else []
        out = []
        for name in names or []:
            module = getattr(model, name, None)
            if module is None:
                raise ValueError(f"pipeline.{which}: {self.cfg.target} has no module {name!r}")
            out.append(module)
        return out

    def _end_names(self) -> tuple[list[str], list[str]]:
        pipe = self.run.pipeline if self.run else None
        return (list(pipe.first or []), list(pipe.last or [])) if pipe else ([], [])

    def pipeline_stage(self, model: Any, stage: Any) -> Any:
        return stages.stage_module(model, stage, self._layer_attr(), *self._end_names())
