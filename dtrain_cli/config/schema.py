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

from omegaconf import MISSING

SCHEMA_NAME = "dtrain_schema"


@dataclass
class DataConfig:
    source: str = "builtin"
    """builtin (stdlib sources, byte-level) | text (file or folder) | tokens (.bin) | synthetic
    | shapes (images) | hf (JSONL/Parquet/text files, any tokenizer) | custom (``_target_``)."""
    path: str | None = None
    """File or folder for source=text / tokens / hf."""
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
    """source=hf: json (JSONL) | parquet | text | auto (from the file extension)."""
    text_field: str = "text"
    """source=hf: the column holding the text (json, parquet)."""
    tokenizer: str | None = None
    """source=hf: a local tokenizer folder (tokenizer.json, or any AutoTokenizer folder);
    default: byte-level (vocab 256)."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0: load in the training process)."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (DataLoader default 2; needs num_workers > 0)."""


@dataclass
class ParallelConfig:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    strategy: str = "ddp"
    """How the dp axis holds state: ddp (replicated) | zero1 (optimizer state sharded,
    ZeroRedundancyOptimizer) | fsdp (params, grads and optimizer state sharded, FSDP2)."""
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
    activation_checkpointing: str = "none"
    """none | selective (every other block: the 2nd, 4th, ... of the model, torchtitan's
    layer-wise selective AC) | full (every block): blocks keep only their input and
    recompute the rest in backward (``torch.utils.checkpoint``, non-reentrant)."""


@dataclass
class CommConfig:
    """Gradient communication of data parallel (DDP communication hooks)."""

    compression: str = "none"
    """none | fp16 | bf16 | powersgd (low-rank, with error feedback)."""
    powersgd_rank: int = 4
    powersgd_start_iter: int = 10
    """PowerSGD: exact all-reduce for this many steps first (warm-up)."""
    bucket_mb: float = 25.0
    """DDP gradient bucket size: smaller starts communication earlier in backward."""


@dataclass
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


@dataclass
class PipelineConfig:
    """Pipeline parallelism (pp > 1): stages, schedule and micro-batches."""

    schedule: str = "1f1b"
    """gpipe | 1f1b | interleaved_1f1b | looped_bfs | interleaved_zb | zbv | dualpipev."""
    microbatches: int | None = None
    """Micro-batches per schedule call; default all of a rank's micro-batches of one step."""
    virtual_stages: int = 1
    """Stages per pp rank (interleaved schedules: >= 2; zbv and dualpipev: exactly 2)."""
    layers_per_stage: list[int] | None = None
    """Transformer layers of each stage, e.g. [3, 3]; default an even split."""
    layers: str | None = None
    """Custom models: the attribute holding the layer list the stages split (default: the
    model itself when it is an ``nn.Sequential``)."""
    first: list[str] = field(default_factory=list)
    """Custom models: modules run before the layers, on the first stage (e.g. [embed])."""
    last: list[str] = field(default_factory=list)
    """Custom models: modules run after the layers, on the last stage (e.g. [norm, head])."""


@dataclass
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


@dataclass
class PrecisionConfig:
    name: str = "fp32"
    init_scale: float = 65536.0
    """fp16 only: the dynamic loss scale to start from."""
    growth_interval: int = 2000


@dataclass
class CheckpointConfig:
    every_steps: int = 0
    """Save every N steps; 0 = never by step count."""
    every_minutes: float = 0.0
    """Save when this many minutes passed since the last save; 0 = never by time."""
    keep_last: int = 3
    at_end: bool = True
    async_save: bool = False


@dataclass
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


@dataclass
class LoggingConfig:
    every: int = 10
    """Reduce and log the loss every N steps (a host sync + one collective each time)."""
    tensorboard: bool = True
    progress: str = "auto"
    """auto (a bar on a terminal, lines otherwise) | bar | lines | off."""


@dataclass
class DebugConfig:
    """When a run goes wrong: hangs, mismatched collectives, stragglers, diverging
    replicas, profiles (:mod:`dtrain_cli.runtime.diagnostics.watchdog` and its neighbours)."""

    collective_timeout_s: float = 300.0
    """A step (or a collective) taking longer: every rank's stack goes to ``logs/hang/``,
    the launcher names the stuck and missing ranks and the job ends. The process group's
    timeout is this plus 15 s (the watchdog speaks first). 0: no watchdog (300 s)."""
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


@dataclass
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
    collective_timeout_s: int | None = None
    """The process group's timeout: seconds a collective waits for a peer before the rank
    fails (a frozen rank is then named: 'stopped answering'). Default: the hang watchdog's
    ``debug.collective_timeout_s`` + 15 s (the watchdog speaks first), 300 without it."""
    node_timeout_s: int = 15
    """Elastic runs: seconds without a heartbeat before a node counts as lost."""
    last_call_s: int = 10
    """Elastic runs: seconds the rendezvous waits for more nodes once MIN are there."""
    python: str | None = None
    """``dtrain run``: the interpreter that runs your script on every rank (each rank a
    fresh ``PYTHON -u``, as ``start_method=spawn``), e.g. another venv's
    ``.venv/bin/python`` whose packages the script imports. Default: dtrain's own."""


@dataclass
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


@dataclass
class ClusterConfig:
    """Where ``dtrain sbatch`` sends a run (SLURM site defaults: ``configs/cluster/<site>.yaml``)
    and how a run answers a preemption. Checked in :mod:`dtrain_cli.launch.slurm`."""

    name: str = "local"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    """Wall-clock limit (#SBATCH --time): MM, HH:MM:SS or D-HH:MM:SS."""
    gpus_per_node: int = 0
    """GPUs per node (#SBATCH --gpus-per-node); > 0 runs one worker per GPU."""
    cpus_per_task: int | None = None
    """CPUs for each node's launcher and its workers (#SBATCH --cpus-per-task)."""
    mem: str | None = None
    """Memory per node (#SBATCH --mem), e.g. 200G."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run at every job start (module load ..., source .../activate): site code."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables exported in the job script (values are quoted)."""
    sbatch_args: list[str] = field(default_factory=list)
    """Extra #SBATCH options, one per item, e.g. --constraint=a100."""
    python: str | None = None
    """Python with dtrain on the compute nodes; default the one running ``dtrain sbatch``."""
    rdzv_port: int = 0
    """c10d rendezvous port on the first node; 0 = 20000 + job id % 20000."""
    signal: str = "USR1"
    """Asks workers to checkpoint at the next logging step and stop (SLURM: --signal)."""
    signal_lead_s: int = 120
    """Seconds before the time limit SLURM sends ``signal`` (it may come up to 60 s early)."""
    checkpoint_on_sigterm: bool = True
    """Under SLURM or in a Kubernetes pod, SIGTERM (preemption, scontrol requeue, a pod's
    deletion or eviction) also asks for that checkpoint."""
    requeue: bool = True
    """After a preemption checkpoint the job requeues itself and resumes from it."""
    max_requeues: int = 20
    # Kubernetes (``dtrain k8s``, docs/kubernetes.md); checked in dtrain_cli.config.k8s_fields
    image: str | None = None
    """Kubernetes: the container image every pod runs (dtrain and your code installed)."""
    k8s_kind: str = "jobset"
    """Kubernetes: jobset (a JobSet, jobset.x-k8s.io/v1alpha2) | trainjob (a Kubeflow
    Trainer v2 TrainJob on the runtime ``trainjob_runtime``)."""
    namespace: str | None = None
    """Kubernetes namespace; default: the kube-context's (``--submit``) or none (the file)."""
    queue: str | None = None
    """Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name``): all pods admitted together."""
    pvc: str | None = None
    """PersistentVolumeClaim holding the run dirs, mounted at ``run_root`` in every pod
    (ReadWriteMany for several nodes); unset: an emptyDir per pod, lost at a restart."""
    run_root: str = "/runs"
    """Kubernetes: where the run dirs' volume is mounted; the run dir is run_root/<name>."""
    shm_size: str | None = None
    """Kubernetes: size limit of the memory-backed /dev/shm, e.g. 64Gi; unset: no limit
    (it counts against the pod's memory)."""
    service_account: str | None = None
    """Kubernetes service account of the pods (image pull secrets, storage access)."""
    gpu_resource: str = "nvidia.com/gpu"
    """Kubernetes: the extended resource ``gpus_per_node`` requests (amd.com/gpu ...)."""
    grace_period_s: int | None = None
    """Kubernetes: seconds from SIGTERM to SIGKILL (terminationGracePeriodSeconds); unset:
    from the plan's estimate of the time to the next logging step plus one checkpoint."""
    storage_gbps: float = 1.0
    """Kubernetes: write bandwidth of the run dirs' volume (GB/s), for that estimate."""
    trainjob_runtime: str = "torch-distributed"
    """k8s_kind=trainjob: the ClusterTrainingRuntime the TrainJob runs on."""


@dataclass
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


@dataclass
class HardwareConfig:
    """One kind of device and its links, for ``dtrain advise`` and the plan's step-time
    estimate (``configs/hardware/<name>.yaml``; each value's source is a comment there)."""

    name: str = "cpu"
    device: str = "cpu"
    """cpu | cuda: the run.device layouts are planned for."""
    memory_gib: float = 0.0
    """Memory per device (GiB)."""
    reserved_gib: float = 0.0
    """Memory per device not available to tensors (CUDA context, allocator slack)."""
    peak_tflops_bf16: float = 0.0
    """Dense bf16/fp16 matmul peak per device (TFLOP/s), no sparsity."""
    peak_tflops_fp32: float = 0.0
    """Dense fp32 peak per device (TFLOP/s; plain fp32, not TF32)."""
    matmul_efficiency: float = 0.5
    """Fraction of the peak the matmuls of a large model reach: the ceiling of the step-time
    model's compute efficiency, which ``memory_gbps`` lowers for narrow models and small
    micro-batches (:func:`dtrain_cli.plan.steptime.compute_efficiency`)."""
    attention_efficiency: float = 0.0
    """Fraction of the peak the attention's score and value products (flash attention,
    12 L d s FLOPs per token) reach; 0: the same as the other matmuls."""
    memory_gbps: float = 0.0
    """Device memory bandwidth (GB/s; HBM on a GPU). 0: the memory-bound share of a step is
    left out (compute at ``peak * matmul_efficiency`` whatever the shapes)."""
    devices_per_node: int = 1
    intra_node_gbps: float = 0.0
    """Per-device bandwidth to devices of the same node, one direction (GB/s)."""
    intra_node_latency_us: float = 0.0
    inter_node_gbps: float = 0.0
    """Per-device bandwidth to other nodes, one direction (GB/s)."""
    inter_node_latency_us: float = 0.0
    comm_overlap: float = 1.0
    """Fraction of data-parallel communication that can hide behind compute: 1 where
    collectives run on their own engines (NCCL on GPUs), 0 where the same cores do both
    (gloo on a CPU)."""


@dataclass
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


def register_schema() -> None:
    """Store the schema so ``configs/base.yaml`` can extend it (``defaults: [dtrain_schema]``)."""
    from hydra.core.config_store import ConfigStore  # here, not at import: keeps --help fast

    from dtrain_cli.models import schema_classes

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=DtrainConfig)
    for name, cls in schema_classes().items():
        store.store(group="model", name=name, node=cls)
