"""The torch side of ``model=hf``: build, counts from a meta build, pipeline stages,
``save_pretrained`` export. Tensor parallel: :mod:`.tensor_parallel`; config and checks:
:mod:`.spec`.

    dtrain launch recipe=llama_tiny_hf tp=2 pp=2

A pipeline stage (:class:`HFStage`) keeps the full model's parameter names
(``model.layers.5.self_attn.q_proj.weight``), so DCP checkpoints reshard between layouts;
it owns the embeddings (first stage) or the final norm and LM head (last), and makes its
position ids, rotary embeddings and causal mask with transformers' own functions.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from unittest import mock

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from dtrain_cli.errors import ConfigError
from dtrain_cli.models.hf.library import transformers_module
from dtrain_cli.models.hf.tensor_parallel import (
    tp_patterns,
    tp_plan,
    tp_replicated,
    tp_style_of,
    tp_whole_by_place,
)
from dtrain_cli.models.spec import tensor_sizes

if TYPE_CHECKING:
    from dtrain_cli.models.spec import StageSpan as StagePlan


class HFSpec(Protocol):
    """What the worker side reads of :class:`~.spec.HFSpec` (the spec imports this module
    lazily; this one does not import the spec)."""

    cfg: Any
    hf_config: Any


# per family: (embedding modules, layer list, final norm, rotary embedding or None)
LAYOUTS: dict[str, tuple[tuple[str, ...], str, str, str | None]] = {
    "gpt2": (("wte", "wpe", "drop"), "h", "ln_f", None),
    "llama": (("embed_tokens",), "layers", "norm", "rotary_emb"),
}
for _family in ("mistral", "qwen2", "qwen3"):
    LAYOUTS[_family] = LAYOUTS["llama"]


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' tqdm bars off inside, as they were after (dtrain reports progress)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def build(spec: HFSpec, device: torch.device | str) -> nn.Module:
    """The causal LM in fp32: random init from the global RNG, or local pretrained weights."""
    tf = transformers_module()
    conf, m = spec.hf_config, spec.cfg
    kwargs = {"attn_implementation": m.attn_implementation, "dtype": torch.float32}
    if m.pretrained:
        with no_progress_bars():  # "Loading weights: 100%" from every rank, on the console
            model = tf.AutoModelForCausalLM.from_pretrained(
                os.path.expanduser(m.pretrained), config=conf, local_files_only=True, **kwargs
            )
        model = model.to(device)
    else:
        with torch.device(device):
            model = tf.AutoModelForCausalLM.from_config(conf, **kwargs)
    model.config.use_cache = False  # training: no KV cache object built in every forward
    if getattr(model, "loss_type", None) is None:  # transformers reads it off the class
        model.loss_type = "ForCausalLM"  # name (GPT2LMHeadModel: none, warned every start)
    return model


def meta_counts(spec: HFSpec, model: nn.Module | None = None) -> dict[str, Any]:
    """What the plan needs, read off a build that allocates nothing: ``model`` (built under
    fake tensors) or a meta-device build."""
    conf = spec.hf_config
    if model is None:
        with torch.device("meta"):
            model = transformers_module().AutoModelForCausalLM.from_config(
                conf, attn_implementation=spec.cfg.attn_implementation
            )
    base = model.base_model
    layers = _layer_list(model)

    def numel(*modules: nn.Module | None) -> int:
        seen = {id(p): p for mod in modules if mod is not None for p in mod.parameters()}
        return sum(p.numel() for p in seen.values())

    layout = LAYOUTS.get(conf.model_type)
    first = [getattr(base, n) for n in layout[0]] if layout else [model.get_input_embeddings()]
    norm = getattr(base, layout[2]) if layout else None
    heads = int(conf.num_attention_heads)
    hidden = int(conf.hidden_size)
    inter = getattr(conf, "intermediate_size", None) or getattr(conf, "n_inner", None) or 4 * hidden
    return {
        "num_params": numel(model),
        "num_layers": len(layers),
        "params_per_layer": numel(layers[0]) if layers else 0,
        "params_first": numel(*first),
        "params_position": numel(getattr(base, "wpe", None)),
        "params_last": numel(norm) + (model.get_output_embeddings().weight.numel()),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(getattr(conf, "num_key_value_heads", None) or heads),
        "intermediate": int(inter),
        "vocab": int(conf.vocab_size),
        "max_positions": int(getattr(conf, "max_position_embeddings", 0) or 0),
        "tp_plan": tp_plan(model),
        "tp_replicated": tp_replicated(model),
        "tp_replicated_places": tp_whole_by_place(model),
        "matrix_shapes": [list(p.shape) for p in model.parameters() if p.dim() == 2],
        "param_rows": [[p.shape[0], p.numel()] for p in model.parameters() if p.dim()],
        "tensor_sizes": tensor_sizes(model),
        "batchnorm_layers": sum(isinstance(m, _BatchNorm) for m in model.modules()),
    }


def plan_facts(spec: HFSpec) -> dict[str, Any]:
    """What the plan's record keeps of the model (:mod:`.facts_cache`): its counts and the
    bytes one window saves for backward, both from one build under fake tensors (the counts
    from a meta-device build when the family does not build or run under them)."""
    with fake_built(spec) as model:
        if model is not None:
            counts, saved = meta_counts(spec, model), saved_per_sample(spec, model)
            low = saved_low_precision(spec, model) if saved else {}
            return {**counts, "saved": saved, **low}
    try:
        return {**meta_counts(spec), "saved": None}
    except Exception as exc:  # transformers' own checks of the config: one line, no trace
        raise ConfigError([build_problem(spec, exc)]) from None


def build_problem(spec: HFSpec, exc: Exception) -> str:
    """Why transformers would not build the model from its config, with the key to change
    where the error names one (a pad_token_id past a smaller vocab_size)."""
    conf, kind = spec.hf_config, spec.hf_config.model_type
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    pad = getattr(conf, "pad_token_id", None)
    if "padding_idx" in said.lower() and pad is not None and pad >= conf.vocab_size:
        whose = "" if "pad_token_id" in spec.cfg.config else f" ({kind}'s default)"
        return (
            f"model.config.pad_token_id={pad}: not below model.config.vocab_size="
            f"{conf.vocab_size}{whose}; set model.config.pad_token_id=0 (or null)"
        )
    if "does not support an attention implementation" in said:
        return (
            f"model.attn_implementation={spec.cfg.attn_implementation}: transformers' {kind} "
            "does not support it; set model.attn_implementation=eager"
        )
    return (
        f"model.model_type={kind}: transformers cannot build it from this config "
        f"({type(exc).__name__}: {said}); check the model.config.* values"
    )


def unpacked_windows() -> contextlib.AbstractContextManager:
    """The forward under fake tensors as on real ones: dtrain's windows are never packed
    sequences, which transformers finds out by reading the position ids; fake tensors
    cannot be read, so it would build the s x s causal mask (and SDPA would fall back to
    its math kernel, which keeps the scores) where a real run passes ``is_causal``."""
    transformers_module()
    try:
        masking = importlib.import_module("transformers.masking_utils")
    except ImportError:  # a transformers without it builds its masks otherwise
        return contextlib.nullcontext()
    if not hasattr(masking, "find_packed_sequence_indices"):
        return contextlib.nullcontext()
    return mock.patch.object(masking, "find_packed_sequence_indices", lambda *_a, **_k: None)


@contextlib.contextmanager
def fake_built(spec: HFSpec) -> Iterator[nn.Module | None]:
    """The model built in fp32 under torch's ``FakeTensorMode`` (no memory, no compute; CPU
    kernels chosen as on a real run), the mode active while the caller uses it; None for a
    family that does not build under fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tf = transformers_module()
    with unpacked_windows(), FakeTensorMode(allow_non_fake_inputs=True), torch.device("cpu"):
        try:
            attn = spec.cfg.attn_implementation
            model = tf.AutoModelForCausalLM.from_config(
                spec.hf_config, attn_implementation=attn, dtype=torch.float32
            )
            model.config.use_cache = False
        except Exception:  # a family fake tensors cannot build: the meta build counts
            model = None
        yield model


def saved_per_sample(spec: HFSpec, model: nn.Module) -> dict[str, float] | None:
    """What autograd keeps for backward in one forward and loss of one ``block_size``
    window (:func:`dtrain_cli.models.saved_bytes.measure_saved`), in fp32, on ``model``
    built by :func:`fake_built` (SDPA keeping no s x s scores). None when the family's
    forward does not run under fake tensors (the plan then uses Korthikanti et al.'s
    formula)."""
    from dtrain_cli.models.losses import cross_entropy
    from dtrain_cli.models.saved_bytes import measure_saved

    def forward_loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return cross_entropy(model(input_ids=inputs, use_cache=False).logits, inputs)

    try:
        x = torch.zeros(1, int(spec.cfg.block_size), dtype=torch.long)
        saved = measure_saved(model, _layer_list(model), x, forward_loss, tp_whole(model))
    except Exception:  # a family fake tensors cannot run: the formula stands in
        return None
    return dict(vars(saved))


def tp_whole(model: nn.Module) -> set[int]:
    """The modules whose saved tensors every tp rank keeps whole under the model's own tp
    plan (:func:`dtrain_cli.models.saved_bytes.kept_whole_under_tp`)."""
    from dtrain_cli.models.saved_bytes import kept_whole_under_tp

    plan = tp_patterns(model)
    return kept_whole_under_tp(model, lambda name: tp_style_of(plan, name))


def saved_low_precision(spec: HFSpec, model: nn.Module) -> dict[str, Any]:
    """The same window's saved bytes at 2 bytes a value, as :func:`saved_per_sample`
    (:func:`dtrain_cli.models.saved_bytes.measure_low_precision`): a Llama's RMSNorm
    computes in fp32 and keeps what it upcasts at 4 bytes. Changes ``model``'s parameters'
    dtype: the caller's last use. {} when a forward fails under autocast."""
    from dtrain_cli.models.saved_bytes import measure_low_precision

    return measure_low_precision(model, lambda m: saved_per_sample(spec, m))


def _layer_list(model: nn.Module) -> list[nn.Module]:
    layout = LAYOUTS.get(model.config.model_type)
    if layout:
        return list(getattr(model.base_model, layout[1]))
    from dtrain_cli.models.units import largest_module_list

    return largest_module_list(model)


# -- pipeline stages -------------------------------------------------------------------------
class HFStage(nn.Module):
    """One pipeline stage of a decoder-only HF model: token ids (first stage) or hidden
    states (B, T, D) in; hidden states out, logits (B, T, V) from the last stage."""

    def __init__(self, model: nn.Module, stage: StagePlan) -> None:
        super().__init__()
        conf = model.config
        embeds, layer_list, norm, rotary = LAYOUTS[conf.model_type]
        self.config = conf
        self.base_model_prefix = model.base_model_prefix
        self.hf_tp_plan = tp_plan(model)
        self.first, self.last = stage.embeddings, stage.head
        self.model_type = conf.model_type
        base = model.base_model
        body = nn.Module()
        if self.first:
            for name in embeds:
                body.add_module(name, getattr(base, name))
        lo, hi = stage.layers
        kept = nn.ModuleList()
        for i, layer in enumerate(getattr(base, layer_list)):
            if lo <= i < hi:
                kept.add_module(str(i), layer)  # the full model's index: names line up
        body.add_module(layer_list, kept)
        if self.last:
            body.add_module(norm, getattr(base, norm))
        if rotary:
            body.add_module(rotary, getattr(base, rotary))
        self.names = (embeds, layer_list, norm, rotary)
        self.add_module(self.base_model_prefix, copy.deepcopy(body))
        if self.last:
            self.lm_head = copy.deepcopy(model.get_output_embeddings())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        embeds, layer_list, norm, rotary = self.names
        body = getattr(self, self.base_model_prefix)
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        if self.first:
            h = body.get_submodule(embeds[0])(x)
            if self.model_type == "gpt2":
                h = body.drop(h + body.wpe(pos))
        else:
            h = x
        kinds = self._layer_kinds()
        makers = {"full_attention": create_causal_mask}
        makers["sliding_attention"] = create_sliding_window_causal_mask
        masks = {
            kind: makers[kind](
                config=self.config,
                inputs_embeds=h,
                attention_mask=None,
                cache=None,
                position_ids=pos,
            )
            for kind in set(kinds.values())
        }
        rope = getattr(body, rotary)(h, position_ids=pos) if rotary else None
        for name, layer in body.get_submodule(layer_list).named_children():
            mask = masks[kinds[int(name)]]
            if self.model_type == "gpt2":
                h = layer(h, None, mask, position_ids=pos)
            else:
                h = layer(h, attention_mask=mask, position_embeddings=rope, position_ids=pos)
            if isinstance(h, tuple):
                h = h[0]
        if self.last:
            return self.lm_head(getattr(body, norm)(h))
        return h

    def _layer_kinds(self) -> dict[int, str]:
        """Each owned layer's mask: its ``layer_types`` entry (Qwen2/3), sliding for a
        Mistral with a window, full otherwise (what each family's forward picks)."""
        layer_list = self.names[1]
        idx = [
            int(n)
            for n, _ in getattr(self, self.base_model_prefix)
            .get_submodule(layer_list)
            .named_children()
        ]
        types = getattr(self.config, "layer_types", None)
        if types:
            return {i: types[i] for i in idx}
        sliding = self.model_type == "mistral" and getattr(self.config, "sliding_window", None)
        return dict.fromkeys(idx, "sliding_attention" if sliding else "full_attention")


def split_stage(spec: HFSpec, model: nn.Module, stage: StagePlan) -> HFStage:
    if model.config.model_type not in LAYOUTS:
        raise ValueError(f"model_type={model.config.model_type}: no pipeline split")
    return HFStage(model, stage)


# -- export ----------------------------------------------------------------------------------
def save_pretrained(model: nn.Module, out: Path) -> list[Path]:
    """``out/`` as ``save_pretrained`` writes it (config.json, model.safetensors, generation
    config), so ``AutoModelForCausalLM.from_pretrained(out)`` gives the same logits. Written
    to a temporary folder first: a failed export leaves nothing half-written."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    use_cache = model.config.use_cache
    model.config.use_cache = True  # for whoever generates with the export
    try:
        with no_progress_bars():  # "Writing model shards: 100%" of one file, on stderr
            model.save_pretrained(str(tmp))
    finally:
        model.config.use_cache = use_cache
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for f in sorted(tmp.iterdir()):
        os.chmod(f, 0o644)
        os.replace(f, out / f.name)
        written.append(out / f.name)
    tmp.rmdir()
    return written
