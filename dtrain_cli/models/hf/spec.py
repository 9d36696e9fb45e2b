"""Hugging Face causal LMs (``model=hf``): config, facts from a meta build, layout checks.

    dtrain launch recipe=llama_tiny_hf dp=2 parallel.strategy=fsdp
    dtrain launch model=hf model.model_type=gpt2 model.config.n_layer=2 model.config.n_embd=64 \
        model.config.n_head=4 model.config.vocab_size=256 parallel.strategy=fsdp dp=2
    dtrain launch model=hf model.pretrained=/models/my-llama ...   # local weights, no download

The model is built with ``AutoModelForCausalLM.from_config`` from ``model.model_type`` and
``model.config`` (keyword arguments of that transformers config class), or loaded with
``from_pretrained(model.pretrained, local_files_only=True)``. What distributed code needs
comes from the model itself, as accelerate and torchtitan read it: ``_no_split_modules``
(FSDP units), ``base_model_tp_plan`` + ``_tp_plan`` (tensor parallel), ``tie_word_embeddings``.
The plan's counts come from a meta-device build (a torch and transformers import, about
5 s), recorded per model config in the data cache (:mod:`.facts_cache`): a launch of a config
seen before reads the record and imports neither. Importing this module imports neither;
the torch side is :mod:`.net`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtrain_cli.errors import ConfigError
from dtrain_cli.hub import download_hint
from dtrain_cli.models.hf.config_checks import config_error, config_keys, pretrained_problems
from dtrain_cli.models.hf.facts_cache import FOLDER, facts_key
from dtrain_cli.models.hf.library import transformers_module
from dtrain_cli.models.hf.tp_checks import head_problems, tp_problems
from dtrain_cli.models.records import cache_root, load, store
from dtrain_cli.models.saved_bytes import SavedBytes, autocast_extra_bytes, low_precision_bytes
from dtrain_cli.models.spec import ModelFacts, ModelSpec

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig

_RECORDS: dict[str, dict[str, Any]] = {}
"""The plan's records by :func:`.facts_cache.facts_key`, once per process (``dtrain advise``
plans dozens of layouts of one model; each would build it again)."""

PIPELINE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2")
"""Decoder-only families laid out embed -> layers -> norm -> head (:mod:`.net` splits them)."""


@dataclass(kw_only=True)
class HFConfig:
    """A transformers causal LM, from its config (random init) or from a local folder."""

    kind: str = "hf"
    name: str = "hf"
    model_type: str | None = None
    """A transformers model type (llama, gpt2, qwen2, mistral, ...); unset with ``pretrained``."""
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of that config class (e.g. num_hidden_layers=2); with ``pretrained``
    they override the saved config."""
    pretrained: str | None = None
    """A local folder with config.json and weights (``save_pretrained``); never downloaded."""
    block_size: int = 128
    """Tokens per training window."""
    attn_implementation: str = "sdpa"
    """sdpa | eager (transformers' attention kernels)."""

    @property
    def vocab_size(self) -> int | None:
        """The transformers config's vocabulary (what token data is checked against); None
        while the config cannot be made (the plan reports why)."""
        try:
            return HFSpec(self).vocab_size
        except ConfigError:
            return None


class HFSpec(ModelSpec):
    kind = "hf"
    config_class = HFConfig
    cfg: HFConfig
    vocab_key = "model.config.vocab_size"

    @property
    def name(self) -> str:
        """``model.name`` when a recipe set one, else the model type or the local folder."""
        m = self.cfg
        if m.name != "hf":
            return m.name
        return m.model_type or (Path(m.pretrained).name if m.pretrained else "") or "hf"

    # -- the transformers config ---------------------------------------------------------------
    def config_problems(self) -> list[str]:
        """What stops the transformers config from being made (checked before anything else)."""
        m = self.cfg
        out = []
        if m.block_size < 1:
            out.append(f"model.block_size={m.block_size}: must be >= 1")
        if m.attn_implementation not in ("sdpa", "eager"):
            out.append(f"model.attn_implementation={m.attn_implementation}: use sdpa or eager")
        if m.pretrained:
            folder = Path(os.path.expanduser(m.pretrained))
            if not folder.is_dir():
                out.append(
                    f"model.pretrained={m.pretrained}: no such folder (a local model "
                    f"folder){download_hint('model.pretrained', m.pretrained)}"
                )
            elif not (folder / "config.json").is_file():
                out.append(
                    f"model.pretrained={m.pretrained}: no config.json there "
                    f"(a folder written by save_pretrained)"
                )
            else:
                out += pretrained_problems(m.pretrained, m.model_type, m.config)
            return out
        if not m.model_type:
            return [
                *out,
                "model.model_type: unset; name a transformers model type "
                "(e.g. llama, gpt2, qwen2) or set model.pretrained=DIR",
            ]
        if self._known() is not None:  # recorded only once these checks had passed
            return out
        tf = transformers_module()
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if m.model_type not in CONFIG_MAPPING:
            return [
                *out,
                f"model.model_type={m.model_type}: not a transformers model type "
                f"(transformers {tf.__version__}); e.g. {', '.join(PIPELINE_FAMILIES)}",
            ]
        if m.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return [
                *out,
                f"model.model_type={m.model_type}: has no causal LM in transformers; "
                f"e.g. {', '.join(PIPELINE_FAMILIES)}",
            ]
        cls = CONFIG_MAPPING[m.model_type]
        known = config_keys(cls)
        unknown = [k for k in m.config if known and k not in known]
        if unknown:
            out.append(
                f"model.config.{unknown[0]}: not an argument of {cls.__name__}"
                + (f" (nor {', '.join(unknown[1:])})" if unknown[1:] else "")
            )
        return out

    @cached_property
    def hf_config(self) -> Any:
        """The transformers config the model is built from (``ConfigError`` when it cannot be)."""
        problems = self.config_problems()
        if problems:
            raise ConfigError(problems)
        tf = transformers_module()
        m = self.cfg
        try:
            if m.pretrained:
                conf = tf.AutoConfig.from_pretrained(
                    os.path.expanduser(m.pretrained), local_files_only=True, **m.config
                )
            else:
                conf = tf.AutoConfig.for_model(m.model_type, **m.config)
        except Exception as e:  # also huggingface_hub's StrictDataclassFieldValidationError
            strict = type(e).__name__.startswith("StrictDataclass")  # no common base to name
            if not isinstance(e, (ValueError, TypeError, OSError)) and not strict:
                raise
            raise ConfigError([config_error(m, e)]) from None
        conf._attn_implementation = m.attn_implementation  # read by the attention layers
        if getattr(conf, "loss_type", None) is None:
            conf.loss_type = "ForCausalLM"  # what transformers picks anyway, without a warning
        return conf

    @property
    def model_type(self) -> str:
        known = self._known()
        return known["model_type"] if known else str(self.hf_config.model_type)

    @property
    def vocab_size(self) -> int | None:
        known = self._known()
        return known["vocab_size"] if known else int(self.hf_config.vocab_size)

    @property
    def tied(self) -> bool:
        known = self._known()
        if known:
            return bool(known["tied"])
        return bool(getattr(self.hf_config, "tie_word_embeddings", False))

    def default_loss(self) -> str:
        return "model"

    def worker_modules(self) -> list[str]:
        t = self.model_type  # transformers' own module layout: models/<type>/modeling_<type>
        return [
            "transformers",
            f"transformers.models.{t}.modeling_{t}",
            "transformers.masking_utils",
            "dtrain_cli.models.hf.net",
        ]

    # -- plan ----------------------------------------------------------------------------------
    @cached_property
    def _key(self) -> str | None:
        m = self.cfg
        options = {"model_type": m.model_type, "pretrained": m.pretrained, "config": m.config}
        return facts_key({**options, "attn": m.attn_implementation, "block_size": m.block_size})

    def _known(self) -> dict[str, Any] | None:
        """The plan's record when this process or the data cache has it; never computes."""
        key = self._key
        if key is None:
            return None
        if key not in _RECORDS:
            record = load(cache_root(self.run), key, FOLDER)
            if record is None:
                return None
            _RECORDS[key] = record
        return _RECORDS[key]

    @property
    def _meta(self) -> dict[str, Any]:
        """The meta build's counts: the record's, or a build (then recorded; a spec made
        without a run config, as tests make them, keeps it in this process only)."""
        known = self._known()
        if known is not None:
            return known["meta"]
        from dtrain_cli.models.hf.net import plan_facts

        conf = self.hf_config
        record = {
            "model_type": str(conf.model_type),
            "vocab_size": int(conf.vocab_size),
            "tied": bool(getattr(conf, "tie_word_embeddings", False)),
            "meta": plan_facts(self),
        }
        if self._key is not None:
            _RECORDS[self._key] = record
            if self.run is not None:
                store(cache_root(self.run), self._key, record, FOLDER)
        return record["meta"]

    def facts(self) -> ModelFacts:
        c = self._meta
        layers, t = c["num_layers"], self.cfg.block_size
        return ModelFacts(
            num_params=c["num_params"],
            num_layers=layers if self.model_type in PIPELINE_FAMILIES else 0,
            params_per_layer=c["params_per_layer"],
            params_first=c["params_first"],
            params_last=c["params_last"],
            tokens_per_sample=t,
            unit="tokens",
            flops_per_unit=6 * (c["num_params"] - c["params_position"])
            + 12 * layers * c["hidden"] * t,
            matrix_shapes=[tuple(s) for s in c["matrix_shapes"]],
            batchnorm_layers=c.get("batchnorm_layers", 0),
            params_tp_replicated=c.get("tp_replicated", 0),
            tp_replicated_places=[tuple(x) for x in c.get("tp_replicated_places", [])],
            param_rows=[(r, n, None) for r, n in c.get("param_rows", [])],
            tensor_sizes=[tuple(t) for t in c.get("tensor_sizes", [])],
        )

    def activation_bytes(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """Measured: what one window's forward saves under fake tensors
        (:func:`.net.saved_per_sample`), times the micro-batch. When that could not run,
        Korthikanti et al. 2022 per block (as for the built-in GPT); the fp32 logits and
        their gradient outside the blocks."""
        c = self._meta
        low = low_precision_bytes(c, micro_batch, tp) if bytes_per_value < 4 else None
        if low is not None:  # measured at 2 bytes a value
            return low
        if c.get("saved"):
            return SavedBytes(**c["saved"]).per_micro_batch(micro_batch, bytes_per_value, tp)
        s, d, a = self.cfg.block_size, c["hidden"], c["heads"]
        per_layer = s * micro_batch * d * (34 + 5 * a * s / d) * (bytes_per_value / 2) / tp
        return per_layer, float(micro_batch * s * c["vocab"] * 4 * 2)

    def autocast_extra_bytes(self, micro_batch: int, tp: int) -> tuple[float, float]:
        """Measured: what autocast over fp32 parameters saves beyond bf16 parameters
        (:func:`.net.saved_low_precision`); 0 when the forward could not be measured."""
        return autocast_extra_bytes(self._meta, micro_batch, tp)

    def checkpoint_bytes(self, micro_batch: int, bytes_per_value: int, tp: int) -> float:
        """A checkpointed decoder layer keeps only its input, the (b, s, hidden) residual
        stream (replicated under tp)."""
        return float(micro_batch * self.cfg.block_size * self._meta["hidden"] * bytes_per_value)

    def problems(self, cfg: DtrainConfig) -> list[str]:
        try:
            out = self.config_problems()
            if out:
                return out
            c = self._meta
        except ConfigError as e:
            return e.problems
        par, m = cfg.parallel, self.cfg
        if c["max_positions"] and m.block_size > c["max_positions"]:
            out.append(
                f"model.block_size={m.block_size}: more than the model's "
                f"max_position_embeddings={c['max_positions']}"
            )
        out += head_problems(c)
        if par.tp > 1:
            out += tp_problems(par.tp, self.model_type, c)
        if par.pp > 1 and self.model_type not in PIPELINE_FAMILIES:
            out.append(
                f"parallel.pp={par.pp}: model.model_type={self.model_type} has no pipeline split "
                f"in dtrain (families: {', '.join(PIPELINE_FAMILIES)}); use pp=1"
            )
        if self.tied and (par.tp > 1 or par.pp > 1):
            out.append(
                "model.config.tie_word_embeddings=true: not supported with tp > 1 or pp > 1 "
                "(the tied weight would live on two stages or in two layouts); set it false"
            )
        if cfg.data.source == "shapes":
            out.append("data.source=shapes: images need an image model (e.g. recipe=cnn_bn)")
        return out

    def supports_tensor_parallel(self) -> bool:
        return bool(self._meta["tp_plan"])

    # -- runtime -------------------------------------------------------------------------------
    def fake_tensor_context(self) -> Any:
        from dtrain_cli.models.hf.net import unpacked_windows

        return unpacked_windows()

    def build(self, device: Any) -> Any:
        from dtrain_cli.models.hf.net import build

        return build(self, device)

    def tensor_shapes(self) -> list[Any]:
        """Every parameter's shape, place and tp split (``dtrain simulate``'s exact count)."""
        from dtrain_cli.models.hf.tensor_parallel import tensor_shapes

        return tensor_shapes(self.build("meta"))

    def loss(self, outputs: Any, targets: Any) -> Any:
        """Cross entropy of the logits against the next tokens (what pipeline stages use)."""
        from dtrain_cli.models.losses import cross_entropy

        return cross_entropy(outputs, targets)

    def forward_loss(self, model: Any, inputs: Any, targets: Any) -> Any:
        """``train.loss=model``: the model's own loss. dtrain's targets are already the next
        tokens, so they go in as ``shift_labels`` (transformers then skips its own shift) and
        the loss equals ``cross_entropy(logits, targets)`` over every position."""
        targets = targets.contiguous()  # transformers views it flat
        out = model(input_ids=inputs, labels=targets, shift_labels=targets, use_cache=False)
        return out.loss.float()

    def fsdp_units(self, model: Any) -> list[Any]:
        from dtrain_cli.models.units import modules_named

        names = list(getattr(model, "_no_split_modules", None) or [])
        units = modules_named(model, names) if names else []
        if units:
            return units
        from dtrain_cli.models.units import largest_module_list

        return largest_module_list(model)

    def fsdp_root_extras(self, model: Any) -> list[Any]:
        """Modules to shard as one ``fully_shard`` group of their own after the units and
        before the root: none. With tied embeddings the token embedding, final norm and LM
        head must stay in one group (torch 2.13 fails the first forward otherwise); leaving
        them all to the root group does that."""
        return []

    def apply_tensor_parallel(self, model: Any, tp_mesh: Any) -> None:
        from dtrain_cli.models.hf.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, tp_mesh)

    def pipeline_stage(self, model: Any, stage: Any) -> Any:
        from dtrain_cli.models.hf.net import split_stage

        return split_stage(self, model, stage)

    def export(self, model: Any, out: Path, fmt: str) -> list[Path]:
        if fmt == "hf":
            from dtrain_cli.models.hf.net import save_pretrained

            return save_pretrained(model, out)
        if fmt == "safetensors":
            return super().export(model, out, fmt)
        raise ValueError(f"--format {fmt}: model.kind=hf exports as hf or safetensors")
