"""The typed schema of a dtrain run: dataclasses registered in Hydra's ConfigStore.

The model's fields belong to its kind (``dtrain_cli/models/<kind>.py``): ``model`` is
typed by the kind's own dataclass, stored in the ConfigStore as ``model/<kind>_schema``.
YAML under ``configs/`` and ``recipes/`` only sets values of these fields; a key that
is not here is an error at composition time, a value of the wrong type too. Choices
(``optim.name``, ``precision.name`` ...) are checked in :mod:`dtrain_cli.config.validate`
so that every bad value is reported together with what is allowed.

No torch import here: ``dtrain --help`` and ``dtrain plan`` stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dtrain_cli.config.site_schema import ClusterConfig, HardwareConfig

MISSING = "???"  # OmegaConf's mark of a required value (omegaconf.MISSING), not imported

SCHEMA_NAME = "dtrain_schema"


@dataclass(kw_only=True)
class DataConfig:
    source: str = "builtin"
    """builtin (stdlib sources, byte-level) | text (file or folder) | tokens (.bin) | synthetic
    | shapes (images) | hf (JSONL/Parquet/text files, any tokenizer) | custom (``_target_``)."""
    path: str | None = None
    """File or folder for source=text / tokens / hf."""
    val_path: str | None = None
    """source=text / hf / tokens (one file): the validation file or folder, read as ``path``
    is (all of ``path`` then trains); default: the last ``val_fraction`` of ``path``."""
    val_fraction: float = 0.1
    token_dtype: str = "uint16"
    """dtype of pre-tokenized .bin files (nanoGPT writes uint16)."""
    synthetic_tokens: int = 2_000_000
    num_samples: int = 4096
    """source=shapes: images drawn (train + val)."""
    cache_dir: str | None = None
    """Where tokenized corpora are cached; default $DTRAIN_CACHE or ~/.cache/dtrain."""
    _target_: str | None = None
    """source=custom: your map-style dataset (class or function), e.g. my_data.Pairs;
    items are (inputs, targets) or a dict of tensors."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """source=custom: keyword arguments of ``_target_`` (extra ``data.*`` keys land here;
    nested ``_target_`` allowed, Hydra ``instantiate`` semantics)."""
    val_target: str | None = None
    """source=custom: the validation dataset (built with ``kwargs``); default: the last
    ``val_fraction`` of the items of ``_target_``."""
    format: str = "auto"
    """source=hf: json (JSONL) | parquet | csv | text | auto (from the file extension)."""
    text_field: str = "text"
    """source=hf: the column holding the text (json, parquet)."""
    tokenizer: str | None = None
    """source=hf: a local tokenizer folder (tokenizer.json, or any AutoTokenizer folder);
    default: byte-level (vocab 256)."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0: load in the training process)."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (DataLoader default 2; needs num_workers > 0)."""


@dataclass(kw_only=True)
class ParallelConfig:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    strategy: str = "ddp"
    """How the dp axis holds state (``dtrain_cli/strategies/``): ddp (replicated) | zero1
    (optimizer state sharded, ZeroRedundancyOptimizer) | fsdp (params, grads and optimizer
    state sharded, FSDP2) | hsdp (fsdp within a shard group, replicas across groups)."""
    dp_shard: int | None = None
    """hsdp: the dp ranks one shard group spans (default: one node's); dp/dp_shard groups
    replicate the model."""
    nproc_per_node: int | None = None
    """Processes per node; default dp*tp*pp / nnodes."""
    nnodes: int = 1
    """Nodes (the largest count with ``nnodes=MIN:MAX``; dp is the dp at that count)."""
    min_nnodes: int | None = None
    """Elastic membership: the fewest nodes the run keeps training on (``nnodes=MIN:MAX``
    sets it); dp shrinks with the nodes, accumulation grows, the global batch stays."""
    find_unused_parameters: bool = False
    reshard_after_forward: bool = True
    """fsdp: free gathered parameters after forward (ZeRO-3); false keeps them (ZeRO-2)."""
    cpu_offload: bool = False
    """fsdp: keep sharded parameters and optimizer state in CPU memory."""
    fsdp_units: list[str] = field(default_factory=list)
    """fsdp: class names of the modules sharded as one unit each (custom models); default
    the model's own blocks (built-in, Hugging Face ``_no_split_modules``) or the children of
    its largest ``nn.ModuleList``."""
    tp_plan: dict[str, str] = field(default_factory=dict)
    """tp > 1 for a custom model: ``parallelize_module`` patterns -> colwise | rowwise |
    colwise_rep | rowwise_rep | sequence, e.g. {"trunk.*.up": colwise, "trunk.*.down": rowwise}."""
    sync_batchnorm: bool = False
    """Batch statistics of every BatchNorm layer over the whole dp group, so dp=N trains as
    dp=1 on the global batch (``nn.SyncBatchNorm`` on CUDA, dtrain's own on CPU/gloo)."""
    activation_checkpointing: str = "none"
    """none | selective (every other block: the 2nd, 4th, ... of the model, torchtitan's
    layer-wise selective AC) | full (every block): blocks keep only their input and
    recompute the rest in backward (``torch.utils.checkpoint``, non-reentrant)."""


@dataclass(kw_only=True)
class CommConfig:
    """Gradient communication of data parallel (DDP communication hooks)."""

    compression: str = "none"
    """none | fp16 | bf16 | powersgd (low-rank, with error feedback)."""
    powersgd_rank: int = 4
    powersgd_start_iter: int = 10
    """PowerSGD: exact all-reduce for this many steps first (warm-up)."""
    bucket_mb: float = 25.0
    """DDP gradient bucket size: smaller starts communication earlier in backward."""


@dataclass(kw_only=True)
class SyncConfig:
    """When replicas synchronize: every step (sync) or by periodic model averaging."""

    mode: str = "sync"
    """sync | local_sgd (replicas step alone, parameters averaged every ``every`` steps) |
    param_server (``servers`` extra processes hold parameters and optimizer state) |
    diloco (``every`` inner steps, then an outer Nesterov step on the averaged delta)."""
    every: int = 8
    warmup_steps: int = 0
    """local_sgd: fully synchronous steps before local steps start."""
    servers: int = 1
    """param_server: server processes (ranks after the dp workers), parameters sharded."""
    max_staleness: int = 0
    """param_server: a worker computes on parameters at most this many steps behind its
    own (stale-synchronous parallel); 0 = synchronous SGD through the servers."""
    outer_lr: float = 0.7
    """diloco: learning rate of the outer (Nesterov momentum SGD) step."""
    outer_momentum: float = 0.9
    """diloco: momentum of the outer step (0: plain SGD on the pseudo-gradient)."""


@dataclass(kw_only=True)
class PipelineConfig:
    """Pipeline parallelism (pp > 1): stages, schedule and micro-batches."""

    schedule: str = "1f1b"
    """gpipe | 1f1b | interleaved_1f1b | looped_bfs | interleaved_zb | zbv | dualpipev."""
    microbatches: int | None = None
    """Micro-batches per schedule call; default all of a rank's micro-batches of one step."""
    virtual_stages: int | None = None
    """Stages per pp rank (interleaved schedules: >= 2; zbv and dualpipev: exactly 2);
    default the schedule's: 2 for zbv and dualpipev, else 1."""
    layers_per_stage: list[int] | None = None
    """Transformer layers of each stage, e.g. [3, 3]; default an even split."""
    layers: str | None = None
    """Custom models: the attribute holding the layer list the stages split (default: the
    model itself when it is an ``nn.Sequential``)."""
    first: list[str] = field(default_factory=list)
    """Custom models: modules run before the layers, on the first stage (e.g. [embed])."""
    last: list[str] = field(default_factory=list)
    """Custom models: modules run after the layers, on the last stage (e.g. [norm, head])."""


@dataclass(kw_only=True)
class OptimConfig:
    name: str = "adamw"
    base_lr: float = 1e-3
    """Learning rate at base_batch_size; scaled by lr_scaling to the run's global batch."""
    base_batch_size: int = 0
    """Global batch at which base_lr was tuned; 0 means the run's own global batch."""
    lr_scaling: str = "none"
    warmup_steps: int = 0
    decay: str = "cosine"
    min_lr: float = 0.0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.0
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 turns clipping off."""


@dataclass(kw_only=True)
class PrecisionConfig:
    name: str = "fp32"
    init_scale: float = 65536.0
    """fp16 only: the dynamic loss scale to start from."""
    growth_interval: int = 2000


@dataclass(kw_only=True)
class CheckpointConfig:
    every_steps: int = 0
    """Save every N steps; 0 = never by step count."""
    every_minutes: float = 0.0
    """Save when this many minutes passed since the last save; 0 = never by time."""
    keep_last: int = 3
    at_end: bool = True
    async_save: bool = False


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 100
    micro_batch_size: int | None = None
    """Samples per rank per forward/backward; default global_batch_size / dp (no
    accumulation), or split into pipeline micro-batches when pp > 1; 8 if no global batch."""
    global_batch_size: int | None = None
    """Samples per optimizer step over all dp ranks; sets grad accumulation."""
    grad_accum: int | None = None
    """Micro-steps per optimizer step (used when global_batch_size is not set; default 1)."""
    seed: int = 1337
    eval_every: int = 0
    """Validate every N steps (0 = only at the end)."""
    eval_batches: int = 4
    compile: bool = False
    loss: str = "auto"
    """cross_entropy (class indices over the last dim: the LM case) | mse | model (the
    model's forward(inputs, targets) returns the loss) | a dotted path to a callable
    (outputs, targets) -> loss | auto (the model kind's default)."""
    on_nan: str = "stop"
    """A non-finite loss or gradient: stop (checked at logging steps; the step, rank and
    first non-finite parameter or gradient named) | skip (drop that update, count it) |
    rollback (restore the newest complete checkpoint, move past the data since). skip and
    rollback decide every step: one small all-reduce per step."""
    on_spike: str = "off"
    """A loss above ``spike_threshold`` x the running median: off | stop | skip | rollback
    (on: one small all-reduce per step)."""
    spike_threshold: float = 3.0
    """A step's loss counts as a spike above this multiple of the median of the last
    ``spike_window`` steps' losses."""
    spike_window: int = 50
    max_skips: int = 5
    """skip: stop after this many skipped steps in a row."""


@dataclass(kw_only=True)
class LoggingConfig:
    every: int = 10
    """Reduce and log the loss every N steps (a host sync + one collective each time)."""
    tensorboard: bool = True
    progress: str = "auto"
    """auto (a bar on a terminal, lines otherwise) | bar | lines | off."""


@dataclass(kw_only=True)
class DebugConfig:
    """When a run goes wrong: hangs, mismatched collectives, stragglers, diverging
    replicas, profiles (:mod:`dtrain_cli.runtime.diagnostics.watchdog` and its neighbours)."""

    collective_timeout_s: float = 300.0
    """The one collective timeout: a step (or a collective) taking longer ends the run.
    With ``hang_watchdog`` every rank's stack goes to ``logs/hang/`` and the launcher names
    the stuck and missing ranks; the process group's own timeout comes 15 s later as a
    backstop. 0: no limit of dtrain's (torch's 300 s process-group timeout)."""
    hang_watchdog: bool = True
    """A thread per rank that reports a hang at ``collective_timeout_s`` (stacks, the last
    collective); false: the process group's timeout alone ends it (the frozen rank is then
    named 'stopped answering')."""
    check_collectives: bool = False
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective's op, shape and dtype checked
    across ranks (mismatches named at the first one; costs a check per collective)."""
    rank_times: bool = True
    """Every rank's step, data-wait and compute times ride on the logging all-reduce (3
    floats per rank): stragglers, per-rank medians in summary.json, ``dtrain report``."""
    straggler_factor: float = 1.5
    """At logging steps, a rank whose own time per step (compute + data wait, without
    waiting for others) is above this multiple of the other ranks' median is named."""
    replica_check_every: int = 0
    """Every N steps, compare a digest of every parameter across the dp group; the first
    differing parameter and rank are named and the run stops. 0: off."""
    replica_check_grads: bool = False
    """replica_check_every: also compare the gradients after the reduce."""
    replica_check_at_end: bool = False
    """At the end of the run, a sha256 of every parameter over the dp group
    (``param_digest``, ``replicas_identical`` in summary.json)."""
    profile_steps: list[int] = field(default_factory=list)
    """[first, last]: a torch.profiler trace per rank of these steps, in ``profile/``."""


@dataclass(kw_only=True)
class LauncherConfig:
    start_method: str = "forkserver"
    """forkserver (a server that imports torch and the runtime on another core while the
    launcher composes; workers forked from it, a process without threads: fastest) |
    fork (from the agent, after it imported the same) | spawn (each worker imports anew)."""
    max_restarts: int = 0
    rdzv_endpoint: str = "localhost:0"
    """host:port of the c10d rendezvous store; port 0 picks a free one (single node)."""
    rdzv_id: str | None = None
    rdzv_timeout_s: int = 900
    threads_per_proc: int | None = None
    """torch threads per worker; default: CPU cores / processes per node."""
    monitor_interval_s: float = 0.1
    node_timeout_s: int = 15
    """Elastic runs: seconds without a heartbeat before a node counts as lost."""
    last_call_s: int = 10
    """Elastic runs: seconds the rendezvous waits for more nodes once MIN are there."""
    python: str | None = None
    """``dtrain run``: the interpreter that runs your script on every rank (each rank a
    fresh ``PYTHON -u``, as ``start_method=spawn``), e.g. another venv's
    ``.venv/bin/python`` whose packages the script imports. Default: dtrain's own."""


@dataclass(kw_only=True)
class RunConfig:
    root: str = "runs"
    name: str | None = None
    """Run directory name under root; default <recipe>-<timestamp>."""
    recipe: str = "custom"
    recipe_named: bool = True
    """False when the command line named no recipe: the default recipe's values apply, and
    a run whose model is not that recipe's is named after its model (set by composition)."""
    device: str = "auto"
    """auto (cuda when GPUs are visible, else cpu) | cpu | cuda."""
    import_roots: list[str] = field(default_factory=list)
    """Where ``_target_`` modules are imported from: set by the launcher (current directory,
    --config-dir folders, PYTHONPATH) so every worker and node imports the same code."""


@dataclass(kw_only=True)
class ScriptConfig:
    """Your own training script, started on every rank as ``python PATH ARGS`` (or
    ``python -m MODULE ARGS``) would be under torchrun: ``dtrain run train.py --epochs 3``.
    Set one of ``path`` and ``module``; the model, data and train loop are the script's."""

    path: str | None = None
    """The script file (relative to the directory dtrain runs in)."""
    module: str | None = None
    """A module run as ``python -m``, e.g. mypkg.train (imported from the current directory)."""
    args: list[str] = field(default_factory=list)
    """The script's own arguments (``sys.argv[1:]``), passed as they are."""


@dataclass(kw_only=True)
class DtrainConfig:
    model: Any = MISSING
    """The model kind's typed config (``dtrain_cli.models``): GPTConfig, CNNConfig, ..."""
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    script: ScriptConfig = field(default_factory=ScriptConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
