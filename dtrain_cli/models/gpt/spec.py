"""The built-in GPT: its config, parameter/FLOP/activation counts and layout checks.

    dtrain plan recipe=gpt_small tp=2 pp=2

Torch-free (the plan imports it); its config is :mod:`.config`, the module :mod:`.net`.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from dtrain_cli.models.gpt.config import ATTENTIONS, LIMITS, POSITIVE, GPTConfig
from dtrain_cli.models.spec import ModelFacts, ModelSpec, TensorShape

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig


class GPTSpec(ModelSpec):
    kind = "gpt"
    config_class = GPTConfig
    cfg: GPTConfig

    def params_per_layer(self) -> int:
        d, b = self.cfg.n_embd, int(self.cfg.bias)
        return 12 * d * d + 9 * d * b + 2 * d * (1 + b)

    def facts(self) -> ModelFacts:
        """The counts, computed once per distinct shape: ``dtrain advise`` asks for them
        for each of thousands of layouts of one model (they are not to be mutated)."""
        return _facts(type(self), tuple(getattr(self.cfg, f) for f in SHAPE_FIELDS))

    def _count(self) -> ModelFacts:
        m, shapes = self.cfg, self.tensor_shapes()
        d = m.n_embd
        first = (m.vocab_size + m.block_size) * d
        norm = d * (1 + int(m.bias))
        last = norm + (0 if m.tie_embeddings else m.vocab_size * d)
        n = first + m.n_layer * self.params_per_layer() + last
        mats = [(m.vocab_size, d), (m.block_size, d)]
        mats += [(d, d)] * 4 * m.n_layer + [(4 * d, d), (d, 4 * d)] * m.n_layer
        if not m.tie_embeddings:
            mats.append((m.vocab_size, d))
        # FLOPs: every matmul weight does 6 per token (forward + backward); the position
        # embedding and an untied token embedding are lookups, not matmuls (a tied one is
        # the LM head's weight, which is)
        matmul_params = n - m.block_size * d - (0 if m.tie_embeddings else m.vocab_size * d)
        return ModelFacts(
            num_params=n,
            num_layers=m.n_layer,
            params_per_layer=self.params_per_layer(),
            params_first=first,
            params_last=m.vocab_size * d + norm,  # a pipeline's last stage keeps its own head
            tokens_per_sample=m.block_size,
            unit="tokens",
            flops_per_unit=6 * matmul_params + 12 * m.n_layer * d * m.block_size,
            score_elements=m.n_layer * m.n_head * m.block_size**2 * (m.attention == "math"),
            matrix_shapes=mats,
            # under tp: the position embedding, every norm and the row-wise layers' biases
            params_tp_replicated=m.block_size * d
            + (2 * m.n_layer + 1) * norm
            + 2 * m.n_layer * d * int(m.bias),
            tp_replicated_places=self._whole_by_place(shapes),
            param_rows=self._param_rows(shapes),
            tensor_sizes=[(math.prod(t.shape), len(t.shape), t.where) for t in shapes],
        )

    @staticmethod
    def _whole_by_place(shapes: list[TensorShape]) -> list[tuple[str | int, int]]:
        """What tp leaves whole (no tp dim), by place (``ModelFacts.tp_replicated_places``)."""
        out: dict[str | int, int] = {}
        for t in shapes:
            if t.tp_dim is None:
                out[t.where] = out.get(t.where, 0) + math.prod(t.shape)
        return list(out.items())

    def _param_rows(self, shapes: list[TensorShape]) -> list[tuple[int, int, int | None]]:
        """The tensors of one dim 0 and tp dim together (every block repeats the same
        ones): FSDP2's padding is the same per element within such a group."""
        rows: dict[tuple[int, int | None], int] = {}
        for t in shapes:
            key = (t.shape[0], t.tp_dim)
            rows[key] = rows.get(key, 0) + math.prod(t.shape)
        return [(dim0, numel, tp_dim) for (dim0, tp_dim), numel in rows.items()]

    def activation_bytes(
        self, micro_batch: int, bytes_per_value: int, tp: int
    ) -> tuple[float, float]:
        """What autograd saves for this implementation (``gpt.net``; measured exactly by
        tests/unit/test_activation_checkpoint.py). Per block, in (b, s, d) tensors: the block
        input and its norm, the MLP input and its norm (replicated under tp: 4), q, k, v
        and the attention output (SDPA's flash kernel keeps no s x s matrix: 4/tp), the MLP's
        4d hidden before and after GELU (8/tp); plus fp32 norm statistics and the attention
        log-sum-exp. ``model.attention=math`` keeps the softmax (b, heads/tp, s, s) in the
        scores' dtype and the block's causal mask (s x s bools) instead of the log-sum-exp.
        Outside the blocks: the final norm's input and output, the fp32 log-softmax of the
        loss (b, s, vocab), token ids and targets (int64). ``model.dropout`` > 0 adds its
        one-byte masks (``gpt.net.Dropout``): after the attention and the MLP (replicated
        under tp) and after the embeddings; under ``math`` also one of the softmax and the
        dropped-out softmax the product with v keeps (Korthikanti et al. 2022's 5as^2b).
        Flash attention's dropout keeps only its RNG state (CUDA; torch's CPU kernel has no
        dropout and falls back to the written-out attention)."""
        m = self.cfg
        b, s, d, a, v = micro_batch, m.block_size, m.n_embd, m.n_head, m.vocab_size
        bsd = b * s * d * bytes_per_value
        heads = a // max(tp, 1)
        drops = m.dropout > 0.0
        if m.attention == "math":
            scores = heads * b * s * s * (bytes_per_value * (1 + drops) + drops) + s * s
        else:
            scores = heads * b * s * 4
        per_layer = bsd * (4 + 12 / tp) + 4 * b * s * 4 + scores + 2 * b * s * d * drops
        outside = 2 * bsd + 2 * b * s * 4 + b * s * v * 4 + b * s * 8  # + targets
        return float(per_layer), float(outside + self.first_stage_bytes(micro_batch))

    def cpu_differences(self) -> list[str]:
        m = self.cfg
        if m.dropout == 0.0 or m.attention != "sdpa":
            return []
        return [
            f"model.dropout={m.dropout} with model.attention=sdpa: torch's CPU attention kernel "
            "has no dropout and falls back to the written-out attention, which keeps s x s "
            "scores: activations measure above the plan here; CUDA's flash attention keeps "
            "only its RNG state, as the plan counts"
        ]

    def first_stage_bytes(self, micro_batch: int) -> float:
        """The token ids (int64) and the positions the embeddings keep for backward, and
        the embedding dropout's mask."""
        m = self.cfg
        drops = m.dropout > 0.0
        return float(micro_batch * m.block_size * (8 + m.n_embd * drops) + m.block_size * 8)

    def autocast_extra_bytes(self, micro_batch: int, tp: int) -> tuple[float, float]:
        """Autocast over fp32 parameters: the block input and the MLP input (the residual
        stream) stay fp32 (+2 bytes each a value), and q, k and v each save their own bf16
        copy of the first norm's fp32 output (+4: three copies where one was counted), all
        replicated under tp; outside, the final norm's input is fp32 (+2). Measured exactly
        by tests/unit/test_activation_checkpoint.py."""
        bsd = micro_batch * self.cfg.block_size * self.cfg.n_embd
        return float(8 * bsd), float(2 * bsd)

    def checkpoint_bytes(self, micro_batch: int, bytes_per_value: int, tp: int) -> float:
        """A checkpointed block keeps only its input, the (b, s, d) residual stream."""
        return float(micro_batch * self.cfg.block_size * self.cfg.n_embd * bytes_per_value)

    def value_problems(self) -> list[str]:
        m = self.cfg
        out = [f"model.{k}={getattr(m, k)}: must be >= 1" for k in POSITIVE if getattr(m, k) < 1]
        out += [
            f"model.{k}={getattr(m, k)}: too large (at most {top:,})"
            for k, top in LIMITS.items()
            if getattr(m, k) > top
        ]
        if not 0.0 <= m.dropout < 1.0:
            out.append(f"model.dropout={m.dropout}: must be in [0, 1)")
        if m.attention not in ATTENTIONS:
            out.append(f"model.attention={m.attention}: choose one of {', '.join(ATTENTIONS)}")
        return out

    def problems(self, cfg: DtrainConfig) -> list[str]:
        m, par = self.cfg, cfg.parallel
        out = []
        if m.n_embd % m.n_head:
            out.append(f"model.n_embd={m.n_embd}: not divisible by model.n_head={m.n_head}")
        if par.tp > 1:
            sizes = {
                "model.n_head": m.n_head,
                "model.n_embd": m.n_embd,
                "model.vocab_size": m.vocab_size,
            }
            allowed = [t for t in range(1, m.n_head + 1) if all(v % t == 0 for v in sizes.values())]
            out += [
                f"{key}={value}: not divisible by tp={par.tp}; this model allows tp in {allowed}"
                for key, value in sizes.items()
                if value % par.tp
            ]
        if m.tie_embeddings and (par.tp > 1 or par.pp > 1):
            out.append(
                "model.tie_embeddings=true: not supported with tp > 1 or pp > 1 "
                "(the tied weight would live on two stages or in two layouts); set it false"
            )
        if cfg.data.source == "shapes":
            out.append("data.source=shapes: images need an image model (e.g. recipe=cnn_bn)")
        return out

    def supports_tensor_parallel(self) -> bool:
        return True

    def layers_label(self, num_layers: int) -> str:
        return f"model.n_layer={num_layers}"

    def tensor_shapes(self) -> list[TensorShape]:
        """Every parameter's shape, place and tensor-parallel split (``gpt.net``'s plan: q,
        k, v, fc and the head column-wise, the projections row-wise, the token embedding
        over the vocabulary); for ``dtrain simulate``'s exact per-rank counts."""
        T = TensorShape
        m = self.cfg
        d, b = m.n_embd, m.bias
        out = [T(name="tok_embeddings.weight", shape=(m.vocab_size, d), where="first", tp_dim=0)]
        out.append(T(name="pos_embeddings.weight", shape=(m.block_size, d), where="first"))
        norm = ["weight", "bias"] if b else ["weight"]
        linears = [("attn.q", d, d, 0), ("attn.k", d, d, 0), ("attn.v", d, d, 0)]
        linears += [("attn.proj", d, d, 1), ("mlp.fc", 4 * d, d, 0), ("mlp.proj", d, 4 * d, 1)]
        for i in range(m.n_layer):
            out += [
                T(name=f"layers.{i}.{n}.{w}", shape=(d,), where=i)
                for n in ("attn_norm", "mlp_norm")
                for w in norm
            ]
            for name, rows, cols, dim in linears:
                out.append(
                    T(name=f"layers.{i}.{name}.weight", shape=(rows, cols), where=i, tp_dim=dim)
                )
                if b:
                    out.append(
                        T(
                            name=f"layers.{i}.{name}.bias",
                            shape=(rows,),
                            where=i,
                            tp_dim=0 if dim == 0 else None,
                        )
                    )
        out += [T(name=f"norm.{w}", shape=(d,), where="last") for w in norm]
        if not m.tie_embeddings:
            out.append(T(name="lm_head.weight", shape=(m.vocab_size, d), where="last", tp_dim=0))
        return out

    def build(self, device: Any) -> Any:
        from dtrain_cli.models.gpt.net import GPT

        with _device(device):
            return GPT(self.cfg)

    def fsdp_units(self, model: Any) -> list[Any]:
        return list(model.layers.values())

    def apply_tensor_parallel(self, model: Any, tp_mesh: Any) -> None:
        from dtrain_cli.models.gpt.net import apply_tensor_parallel

        apply_tensor_parallel(model, tp_mesh)

    def pipeline_stage(self, model: Any, stage: Any) -> Any:
        from dtrain_cli.models.gpt.net import split_stage

        return split_stage(model, stage)


def _device(device: Any) -> Any:
    import torch

    return torch.device(device)


SHAPE_FIELDS = (
    "vocab_size", "block_size", "n_embd", "n_layer", "n_head", "bias", "tie_embeddings",
    "attention",
)  # fmt: skip
"""The config fields the counts depend on (not the name, dropout or the run)."""


@functools.lru_cache(maxsize=64)
def _facts(spec: type[GPTSpec], shape: tuple) -> ModelFacts:
    return spec(GPTConfig(**dict(zip(SHAPE_FIELDS, shape, strict=True))))._count()
