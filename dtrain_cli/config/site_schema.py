"""Where a run goes: the cluster (SLURM, Kubernetes, preemption) and the hardware the
advisor and the step-time model plan for. Part of the typed schema (:mod:`.schema`).

    dtrain sbatch recipe=gpt_small cluster=example_gpu parallel.nnodes=2
    dtrain advise recipe=gpt_small hardware=h100_80g parallel.nnodes=8
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
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
    pod_spec: dict[str, Any] = field(default_factory=dict)
    """Kubernetes: fields added to every pod's spec as written (tolerations, nodeSelector,
    affinity, securityContext, priorityClassName, imagePullSecrets ...); not those dtrain
    sets (containers, volumes, restartPolicy, the grace period, the service account)."""
    container_spec: dict[str, Any] = field(default_factory=dict)
    """Kubernetes: fields added to the container as written (securityContext, envFrom for
    secrets, imagePullPolicy ...); not those dtrain sets (name, image, command, args, env,
    ports, resources, volumeMounts)."""


@dataclass(kw_only=True)
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
