"""Value checks on a composed config: every problem is collected, none stops the others.

Checks that need the whole layout (world size, divisibility by dp/tp/pp, device) and the
registries' choices (``parallel.strategy``, ``sync.mode``) live in
:mod:`dtrain_cli.plan.build`, which adds its problems to the same list.
"""

from __future__ import annotations

import functools
import math
import operator

from dtrain_cli.config.k8s_fields import k8s_field_problems
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.suggest import not_allowed
from dtrain_cli.errors import ConfigError

BUILTIN_LOSSES = ("cross_entropy", "mse", "model")  # dtrain_cli.models.losses (torch)

CHOICES: dict[str, tuple[str, ...]] = {
    "data.source": ("builtin", "text", "tokens", "synthetic", "shapes", "hf", "custom"),
    "data.token_dtype": ("uint8", "uint16", "uint32", "int32"),
    "data.format": ("auto", "json", "parquet", "csv", "text"),
    "parallel.activation_checkpointing": ("none", "selective", "full"),
    "comm.compression": ("none", "fp16", "bf16", "powersgd"),
    "optim.name": ("adamw", "sgd"),
    "optim.lr_scaling": ("none", "linear", "sqrt"),
    "optim.decay": ("cosine", "linear", "constant"),
    "precision.name": ("fp32", "bf16", "fp16"),
    "logging.progress": ("auto", "bar", "lines", "off"),
    "pipeline.schedule": (
        "gpipe",
        "1f1b",
        "interleaved_1f1b",
        "looped_bfs",
        "interleaved_zb",
        "zbv",
        "dualpipev",
    ),
    "launcher.start_method": ("fork", "spawn", "forkserver"),
    "run.device": ("auto", "cpu", "cuda"),
    "train.on_nan": ("stop", "skip", "rollback"),
    "train.on_spike": ("off", "stop", "skip", "rollback"),
    "hardware.device": ("cpu", "cuda"),
}

# key -> (minimum, inclusive?)
POSITIVE: dict[str, tuple[float, bool]] = {
    "parallel.dp": (1, True),
    "parallel.tp": (1, True),
    "parallel.pp": (1, True),
    "parallel.nnodes": (1, True),
    "launcher.node_timeout_s": (1, True),
    "launcher.last_call_s": (0, True),
    "comm.bucket_mb": (0, False),
    "comm.powersgd_rank": (1, True),
    "comm.powersgd_start_iter": (0, True),
    "sync.every": (1, True),
    "sync.warmup_steps": (0, True),
    "sync.servers": (1, True),
    "sync.max_staleness": (0, True),
    "sync.outer_lr": (0, False),
    "optim.base_lr": (0, False),
    "optim.base_batch_size": (0, True),
    "optim.warmup_steps": (0, True),
    "optim.min_lr": (0, True),
    "optim.weight_decay": (0, True),
    "optim.grad_clip": (0, True),
    "optim.momentum": (0, True),
    "precision.init_scale": (0, False),
    "checkpoint.every_steps": (0, True),
    "checkpoint.every_minutes": (0, True),
    "checkpoint.keep_last": (1, True),
    "train.steps": (1, True),
    "train.eval_every": (0, True),
    "train.eval_batches": (1, True),
    "logging.every": (1, True),
    "launcher.max_restarts": (0, True),
    "data.synthetic_tokens": (2, True),
    "data.num_workers": (0, True),
    "train.spike_threshold": (1, False),
    "train.spike_window": (1, True),
    "train.max_skips": (1, True),
    "debug.collective_timeout_s": (0, True),
    "debug.straggler_factor": (1, False),
    "debug.replica_check_every": (0, True),
    "hardware.memory_gib": (0, False),
    "hardware.reserved_gib": (0, True),
    "hardware.peak_tflops_bf16": (0, False),
    "hardware.peak_tflops_fp32": (0, False),
    "hardware.matmul_efficiency": (0, False),
    "hardware.memory_gbps": (0, True),
    "hardware.attention_efficiency": (0, True),
    "hardware.devices_per_node": (1, True),
    "hardware.intra_node_gbps": (0, False),
    "hardware.inter_node_gbps": (0, False),
    "hardware.intra_node_latency_us": (0, True),
    "hardware.inter_node_latency_us": (0, True),
    "data.num_samples": (2, True),
    "optim.eps": (0, False),
    "precision.growth_interval": (1, True),
    "train.seed": (0, True),
    "launcher.rdzv_timeout_s": (1, True),
    "launcher.monitor_interval_s": (0, False),
}
# optional keys: unset (null) or at least 1
OPTIONAL_POSITIVE = (
    "parallel.nproc_per_node",
    "parallel.dp_shard",
    "train.global_batch_size",
    "train.grad_accum",
    "train.micro_batch_size",
    "pipeline.microbatches",
    "pipeline.virtual_stages",
    "launcher.threads_per_proc",
    "data.prefetch_factor",
)
# key -> (low, high): values in [low, high). A model's own fields: its kind checks them
# (``ModelSpec.problems``, dtrain_cli/models).
INTERVALS = {
    "optim.beta1": (0.0, 1.0),
    "optim.beta2": (0.0, 1.0),
    "sync.outer_momentum": (0.0, 1.0),
}
MAX_INT = 2**53  # beyond this, sizes and products stop being exact in the plan's arithmetic
MAX_SEED = 2**32 - 1  # numpy's seed range
MAX_WORLD = 65536


def name_problems(key: str, value: str | None) -> list[str]:
    """A value that becomes one folder name (the run dir under run.root) and a SLURM job
    name: a single path component that no shell or SLURM command reads as an option."""
    if value is None:
        return []
    why = None
    if not value.strip():
        why = "is empty"
    elif "/" in value or "\\" in value:
        why = "contains a path separator"
    elif value in (".", ".."):
        why = "is not a folder name"
    elif value.startswith("-"):
        why = "starts with '-' (commands would read it as an option)"
    elif any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        why = "contains a newline or control character"
    elif len(value.encode()) > 200:
        why = "is longer than 200 bytes"
    if why is None:
        return []
    return [f"{key}={value!r}: {why}; use a single folder name such as my-run_01"]


def profile_problems(steps: list[int], num_steps: int) -> list[str]:
    """``debug.profile_steps``: empty, or [first, last] with 1 <= first <= last <= steps."""
    if not steps:
        return []
    if len(steps) == 2 and 1 <= steps[0] <= steps[1] <= num_steps:
        return []
    return [
        f"debug.profile_steps={list(steps)}: must be [first, last] with "
        f"1 <= first <= last <= train.steps={num_steps}"
    ]


def get_key(cfg: DtrainConfig, key: str) -> object:
    """The value at a dotted key (``operator.attrgetter``'s, one getter per key: the
    advisor checks every field of thousands of layouts)."""
    return _getter(key)(cfg)


@functools.cache
def _getter(key: str) -> operator.attrgetter:
    return operator.attrgetter(key)


def validate_config(cfg: DtrainConfig) -> None:
    problems = config_problems(cfg)
    if problems:
        raise ConfigError(problems)


def range_problems(cfg: DtrainConfig) -> list[str]:
    """Choices and the range of every numeric field: checked before any arithmetic uses
    them, so that no later message is built on an impossible value."""
    problems: list[str] = []
    for key, allowed in CHOICES.items():
        value = get_key(cfg, key)
        if value not in allowed:
            problems.append(not_allowed(key, value, allowed))
    for key, (low, inclusive) in POSITIVE.items():
        value = get_key(cfg, key)
        bad = not value >= low if inclusive else not value > low  # type: ignore[operator]
        if bad:
            rule = f">= {low:g}" if inclusive else f"> {low:g}"
            problems.append(f"{key}={value}: must be {rule}")
    for key in OPTIONAL_POSITIVE:
        value = get_key(cfg, key)
        if value is not None and value < 1:  # type: ignore[operator]
            problems.append(f"{key}={value}: must be >= 1 (or unset)")
    if not 0.0 <= cfg.hardware.comm_overlap <= 1.0:
        problems.append(f"hardware.comm_overlap={cfg.hardware.comm_overlap}: must be in [0, 1]")
    if cfg.hardware.matmul_efficiency > 1.0:
        problems.append(
            f"hardware.matmul_efficiency={cfg.hardware.matmul_efficiency}: a fraction of the "
            f"peak, must be in (0, 1]"
        )
    for key, (low, high) in INTERVALS.items():
        value = get_key(cfg, key)
        if not low <= value < high:  # type: ignore[operator]
            problems.append(f"{key}={value}: must be in [{low:g}, {high:g})")
    if not 0.0 < cfg.data.val_fraction < 1.0:
        problems.append(f"data.val_fraction={cfg.data.val_fraction}: must be in (0, 1)")
    problems += profile_problems(cfg.debug.profile_steps, cfg.train.steps)
    problems += _size_problems(cfg)
    return problems


def _size_problems(cfg: DtrainConfig) -> list[str]:
    out = []
    for key in (*POSITIVE, *OPTIONAL_POSITIVE):
        value = get_key(cfg, key)
        if isinstance(value, float) and math.isinf(value) and value > 0:  # nan, -inf: above
            out.append(f"{key}={value}: must be a finite number")
        elif isinstance(value, int) and value > MAX_INT:
            out.append(f"{key}={value}: too large (at most 2**53)")
    if cfg.train.seed > MAX_SEED:
        out.append(f"train.seed={cfg.train.seed}: must be at most {MAX_SEED} (2**32 - 1)")
    par = cfg.parallel
    if not out and min(par.dp, par.tp, par.pp) >= 1 and par.dp * par.tp * par.pp > MAX_WORLD:
        out.append(
            f"dp*tp*pp = {par.dp}*{par.tp}*{par.pp} = {par.dp * par.tp * par.pp} processes: "
            f"dtrain plans at most {MAX_WORLD}"
        )
    return out


def node_range_problems(cfg: DtrainConfig) -> list[str]:
    """``parallel.nnodes=MIN:MAX``: 1 <= MIN <= MAX."""
    low, high = cfg.parallel.min_nnodes, cfg.parallel.nnodes
    if low is None:
        return []
    if low < 1:
        return [f"parallel.nnodes={low}:{high}: MIN must be >= 1; write MIN:MAX, e.g. 1:{high}"]
    if low > high:
        return [f"parallel.nnodes={low}:{high}: MIN is above MAX; write MIN:MAX with MIN <= MAX"]
    return []


def rollback_problems(cfg: DtrainConfig) -> list[str]:
    """``train.on_nan`` / ``on_spike=rollback`` restores the newest checkpoint: a run that
    saves none before its end has nothing to roll back to."""
    ck = cfg.checkpoint
    if ck.every_steps or ck.every_minutes:
        return []
    return [
        f"train.on_{kind}=rollback: no checkpoint to roll back to (checkpoint.every_steps "
        f"and checkpoint.every_minutes are 0); set checkpoint.every_steps=N, or "
        f"train.on_{kind}=skip"
        for kind, action in (("nan", cfg.train.on_nan), ("spike", cfg.train.on_spike))
        if action == "rollback"
    ]


def config_problems(cfg: DtrainConfig) -> list[str]:
    problems = range_problems(cfg) + node_range_problems(cfg)
    problems += name_problems("run.name", cfg.run.name)
    problems += name_problems("launcher.rdzv_id", cfg.launcher.rdzv_id)
    problems += k8s_field_problems(cfg.cluster)  # values bound for a manifest: their form
    if problems:  # the checks below combine values: only once each value is possible
        return problems
    if cfg.train.global_batch_size is not None and cfg.train.grad_accum is not None:
        problems.append(
            f"train.grad_accum={cfg.train.grad_accum} and train.global_batch_size="
            f"{cfg.train.global_batch_size} are both set (every built-in recipe sets the global "
            "batch): set one, the other follows; e.g. add ~train.global_batch_size to use "
            "train.grad_accum"
        )
    if cfg.optim.min_lr > cfg.optim.base_lr:
        problems.append(f"optim.min_lr={cfg.optim.min_lr}: above optim.base_lr={cfg.optim.base_lr}")
    byte_level = cfg.data.source in ("builtin", "text") or (
        cfg.data.source == "hf" and not cfg.data.tokenizer
    )
    vocab = getattr(cfg.model, "vocab_size", None)  # the model's own checks: plan/build.py
    if byte_level and isinstance(vocab, int) and vocab < 256:
        problems.append(
            f"model.vocab_size={vocab}: byte-level data (data.source={cfg.data.source}) "
            f"needs >= 256"
        )
    loss = cfg.train.loss
    if loss not in ("auto", *BUILTIN_LOSSES) and "." not in loss:
        choices = not_allowed("train.loss", loss, ("auto", *BUILTIN_LOSSES))
        problems.append(f"{choices} or a dotted path to a callable (outputs, targets) -> loss")
    problems += rollback_problems(cfg)
    if cfg.data.source in ("text", "tokens", "hf") and not cfg.data.path:
        problems.append(f"data.path is required for data.source={cfg.data.source}")
    if cfg.data.prefetch_factor is not None and cfg.data.num_workers == 0:
        problems.append(
            f"data.prefetch_factor={cfg.data.prefetch_factor}: needs data.num_workers > 0"
        )
    return problems
