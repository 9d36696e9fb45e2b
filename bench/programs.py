"""The two programs under comparison, run on one workload: ``dtrain launch`` and
``torchrun bench/plain_ddp.py``, and what each reports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from harness import BIN, PLAIN_SCRIPT, Cmd, Workspace, guarded, run_timed

DP = 2
# Quiet, cheap and identical for both programs: no TensorBoard, no bar, eval only at the
# end (one batch, after the timed steps).
DTRAIN_COMMON = (
    "train.eval_every=0",
    "train.eval_batches=1",
    "logging.tensorboard=false",
    "logging.progress=lines",
)


@dataclass(frozen=True)
class Workload:
    """One training job: a recipe with overrides, ``steps`` steps, of which steps
    ``timed_from+1 .. steps`` are timed (``timed_from`` is a multiple of ``log_every``:
    dtrain's metrics are per logging window)."""

    label: str
    recipe: str
    steps: int
    log_every: int
    timed_from: int
    overrides: tuple[str, ...] = ()

    @property
    def timed_steps(self) -> int:
        return self.steps - self.timed_from


@dataclass
class DtrainRun:
    wall_s: float
    run_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    tokens_per_step: int
    cpu_s: float | None
    """CPU seconds of the whole process tree over the timed steps."""

    def _train_times(self) -> dict[int, float]:
        return {m["step"]: m["time"] for m in self.metrics if m.get("kind") == "train"}

    def ms_per_step(self, start: int, end: int) -> float:
        """Wall time between the log records of steps ``start`` and ``end`` (everything:
        steps, the logging collective, metrics.jsonl writes, console lines)."""
        times = self._train_times()
        return 1000 * (times[end] - times[start]) / (end - start)

    def self_reported_ms_per_step(self, start: int) -> float:
        """Mean of dtrain's own ``step_time_ms`` over the windows after ``start``."""
        windows = [
            m["step_time_ms"]
            for m in self.metrics
            if m.get("kind") == "train" and m["step"] > start
        ]
        return sum(windows) / len(windows)


def dtrain_cmd(ws: Workspace, work: Workload, name: str, env: dict[str, str] | None = None) -> Cmd:
    argv = [
        str(BIN / "dtrain"),
        "launch",
        f"recipe={work.recipe}",
        f"dp={DP}",
        f"train.steps={work.steps}",
        f"logging.every={work.log_every}",
        *DTRAIN_COMMON,
        *work.overrides,
        f"run.root={ws.runs}",
        f"run.name={name}",
    ]
    return Cmd(argv, shown_env=dict(env or {}), t0_var="DTRAIN_LAUNCH_T0")


def run_dtrain(
    ws: Workspace, work: Workload, env: dict[str, str] | None = None
) -> tuple[Cmd, DtrainRun]:
    """One launch in a new run dir; redone (in another) if other processes got in the way."""
    return guarded(ws, lambda: _dtrain_once(ws, work, env), f"{work.label} (dtrain)")


def _dtrain_once(
    ws: Workspace, work: Workload, env: dict[str, str] | None = None
) -> tuple[Cmd, DtrainRun]:
    name = ws.next_name(work.label)
    cmd = dtrain_cmd(ws, work, name, env)
    done = run_timed(cmd, ws, (work.timed_from, work.steps))
    run_dir = ws.runs / name
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    tokens = plan["batch"]["tokens_per_step"]
    return cmd, DtrainRun(done.wall_s, run_dir, summary, metrics, tokens, done.cpu_s)


def _get(tree: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``tree["a"]["b"]`` for ``"a.b"``; ``default`` when a key is missing (config keys
    move between dtrain versions)."""
    node: Any = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


# What plain_ddp.py implements: (config key, value it supports, default when absent).
PLAIN_SUPPORTS = (
    ("model.kind", "gpt", "gpt"),
    ("model.dropout", 0.0, 0.0),
    ("model.bias", True, True),
    ("model.tie_embeddings", False, False),
    ("parallel.strategy", "ddp", "ddp"),
    ("parallel.tp", 1, 1),
    ("parallel.pp", 1, 1),
    ("comm.compression", "none", "none"),
    ("sync.mode", "sync", "sync"),
    ("optim.name", "adamw", "adamw"),
    ("optim.decay", "cosine", "cosine"),
)
PLAIN_PRECISIONS = ("fp32", "bf16")
# model.kind=hf: plain_ddp.py --hf-model (bench/hf_workload.py); the layout rows as above.
HF_SUPPORTS = (("model.kind", "hf", "gpt"), *PLAIN_SUPPORTS[4:], ("model.pretrained", None, None))
# model.kind=custom: plain_ddp.py --custom-model (bench/custom_workload.py), token data.
CUSTOM_SUPPORTS = (
    ("model.kind", "custom", "gpt"),
    *PLAIN_SUPPORTS[4:],
    ("train.loss", "auto", "auto"),
)


def plain_args_from_run(run_dir: Path) -> list[str]:
    """plain_ddp.py flags for the job a dtrain run did, from its config.yaml and plan.yaml."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    kind = _get(cfg, "model.kind")
    supports = {"hf": HF_SUPPORTS, "custom": CUSTOM_SUPPORTS}.get(kind, PLAIN_SUPPORTS)
    for key, supported, default in supports:
        value = _get(cfg, key, default)
        if value != supported:
            raise ValueError(f"plain_ddp.py only does {key}={supported}, the run has {value}")
    precision = _get(cfg, "precision.name", "fp32")
    if precision not in PLAIN_PRECISIONS:
        raise ValueError(f"plain_ddp.py does precision.name={PLAIN_PRECISIONS}, not {precision}")
    if _get(cfg, "data.source") not in ("builtin", "synthetic"):
        raise ValueError(f"plain_ddp.py reads data.source=builtin|synthetic, not {cfg['data']}")
    bucket = _get(cfg, "comm.bucket_mb", _get(cfg, "parallel.ddp_bucket_mb", 25.0))
    model_flags = {
        "n-layer": _get(cfg, "model.n_layer"),
        "n-head": _get(cfg, "model.n_head"),
        "n-embd": _get(cfg, "model.n_embd"),
        "vocab-size": _get(cfg, "model.vocab_size"),
    }
    if kind == "hf":  # the transformers config goes whole; the vocabulary is the model's
        keys = ("model_type", "config", "attn_implementation")
        model_flags = {"hf-model": json.dumps({k: _get(cfg, f"model.{k}") for k in keys})}
    if kind == "custom":  # the class, its arguments and where the run imported it from
        kwargs = {k: v for k, v in cfg["model"].items() if k not in ("kind", "_target_")}
        desc = {"_target_": _get(cfg, "model._target_"), "kwargs": kwargs}
        model_flags = {
            "custom-model": json.dumps({**desc, "import_roots": _get(cfg, "run.import_roots")})
        }
    flags: dict[str, Any] = {
        **model_flags,
        "block-size": _get(cfg, "model.block_size"),
        "data-source": _get(cfg, "data.source"),
        "val-fraction": _get(cfg, "data.val_fraction"),
        "micro-batch": _get(plan, "batch.micro_batch_size"),
        "grad-accum": _get(plan, "batch.grad_accum"),
        "seed": _get(cfg, "train.seed"),
        "lr": _get(plan, "lr.peak_lr"),
        "min-lr": _get(plan, "lr.min_lr"),
        "warmup-steps": _get(plan, "lr.warmup_steps"),
        "weight-decay": _get(cfg, "optim.weight_decay"),
        "eps": _get(cfg, "optim.eps"),
        "grad-clip": _get(cfg, "optim.grad_clip"),
        "bucket-mb": bucket,
        "threads": _get(plan, "threads_per_proc"),
    }
    missing = [k for k, v in flags.items() if v is None]
    if missing:
        raise ValueError(f"{run_dir}: config.yaml/plan.yaml lack the values for {missing}")
    flags["precision"] = precision
    flags["device"] = _get(plan, "device")
    args = [a for k, v in flags.items() for a in (f"--{k}", str(v))]
    if _get(cfg, "train.compile", False):
        args.append("--compile")
    return [*args, "--betas", str(_get(cfg, "optim.beta1")), str(_get(cfg, "optim.beta2"))]


def plain_cmd(work: Workload, args: list[str]) -> Cmd:
    argv = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        str(DP),
        str(PLAIN_SCRIPT),
        *loop_args(work, args),
    ]
    return Cmd(argv, t0_var="BENCH_T0")


def loop_args(work: Workload, args: list[str]) -> list[str]:
    """A hand-written loop's flags (``loop_common.parse_args``) for one workload."""
    steps = ["--steps", str(work.steps), "--timed-from", str(work.timed_from)]
    return [*args, *steps, "--log-every", str(work.log_every)]


def run_plain(ws: Workspace, work: Workload, args: list[str]) -> tuple[Cmd, dict[str, Any]]:
    cmd = plain_cmd(work, args)
    timed = (work.timed_from, work.steps)
    done = guarded(ws, lambda: run_timed(cmd, ws, timed), f"{work.label} (plain)")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith('{"bench": "plain_ddp"'):
            return cmd, {**json.loads(line), "wall_s": done.wall_s, "cpu_s": done.cpu_s}
    raise RuntimeError(f"no result line from {cmd.shell()}:\n{done.stdout[-2000:]}")


class Pair:
    """Runs the two programs on one workload, alternately. The plain flags come from the
    first dtrain run (its config.yaml/plan.yaml), so the first program must be dtrain."""

    def __init__(self, ws: Workspace, work: Workload) -> None:
        self.ws, self.work = ws, work
        self.plain_args: list[str] | None = None
        self.commands: dict[str, str] = {}

    def dtrain(self, env: dict[str, str] | None = None, label: str = "dtrain") -> DtrainRun:
        cmd, run = run_dtrain(self.ws, self.work, env)
        if self.plain_args is None:
            self.plain_args = plain_args_from_run(run.run_dir)
        self.commands.setdefault(label, cmd.shown(self.ws))
        return run

    def plain(self) -> dict[str, Any]:
        if self.plain_args is None:
            raise RuntimeError("run dtrain first: the plain flags come from its run dir")
        cmd, result = run_plain(self.ws, self.work, self.plain_args)
        self.commands.setdefault("plain", cmd.shown(self.ws))
        return result
