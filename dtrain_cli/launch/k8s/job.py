"""What a run's Kubernetes manifest says, resolved from its config and plan. Torch-free.

    dtrain k8s recipe=gpt_small parallel.nnodes=4 cluster.gpus_per_node=8 \\
        cluster.image=registry.example/team/train:1.0 --dry-run

Every pod runs ``python -m dtrain_cli agent RUN_DIR --init-from /etc/dtrain``: the agent
copies config.yaml and plan.yaml from the ConfigMap mounted there into the run dir on the
run volume (``cluster.pvc``), then starts its workers exactly as a SLURM node does. Node
rank: the Job's completion index (downward API); rendezvous: pod 0's stable DNS name
``<name>-node-0-0.<name>`` (JobSet's headless service) on a fixed port.

The grace period (``terminationGracePeriodSeconds``) is what a preemption needs: the
workers stop at the next logging step and save a checkpoint (:mod:`dtrain_cli.runtime.
preemption`), so it is estimated as ``logging.every`` steps of the plan's step-time
estimate on ``hardware`` plus the checkpoint's bytes at ``cluster.storage_gbps``, plus a
margin (the SLURM path's equivalent is ``--signal=...@cluster.signal_lead_s``).
"""

from __future__ import annotations

import copy
import math
import re
import time
from dataclasses import dataclass

from dtrain_cli.config.compose import config_to_yaml
from dtrain_cli.config.schema import ClusterConfig, DtrainConfig
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import CONFIG_FILE, PLAN_FILE

JOBSET_API = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
TRAINJOB_API = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
REPLICATED_JOB = "node"
"""The replicated job's and its container's name (Kubeflow's torch runtime uses the same)."""
DEFAULT_PORT = 29500
"""Rendezvous port when ``cluster.rdzv_port`` is 0 (Kubeflow Trainer's trainer port)."""
CONFIG_MOUNT = "/etc/dtrain"
"""Where the ConfigMap's config.yaml and plan.yaml are mounted (read-only)."""
RUN_FILES = (CONFIG_FILE, PLAN_FILE)
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RESTART_ATTEMPT = "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"
POD_SET = ("NODE_RANK", "RESTART_ATTEMPT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
"""The container variables the manifest sets itself (``manifest.container_env``)."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_SUFFIX = len("-abcde")
"""The random suffix the Job controller adds to a pod's name (JobSet's webhook counts it)."""
GRACE_MARGIN_S = 30
"""Seconds on top of the estimate: checkpoint planning, process exits (Kubernetes' default
grace period is 30 s)."""
AGENT_EXIT_S = 5
"""Of the grace period, what the agent keeps for itself after its workers' deadline."""
CONFIGMAP_MAX_BYTES = 1024 * 1024
OPTIMIZER_WORDS = {"adamw": 2, "sgd": 1}
"""fp32 words of optimizer state per parameter (sgd: with momentum)."""
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class K8sJob:
    """Everything the manifest says, resolved."""

    name: str
    """The JobSet's (TrainJob's) name: the run name; pods, DNS names and the ConfigMap
    derive from it."""
    kind: str
    """jobset | trainjob."""
    image: str
    python: str
    """The image's Python with dtrain installed (``cluster.python``, default ``python``)."""
    nnodes: int
    min_nnodes: int | None
    """Elastic (``parallel.nnodes=MIN:MAX``): the fewest nodes the run trains on."""
    nproc_per_node: int
    gpus_per_node: int
    run_dir: str
    """The run dir inside the pods: ``cluster.run_root/<name>``."""
    port: int
    grace_period_s: int
    max_restarts: int
    files: dict[str, str]
    """config.yaml and plan.yaml, as the ConfigMap carries them."""
    summary: str
    cluster: ClusterConfig

    @property
    def files_bytes(self) -> int:
        """The ConfigMap's data: config.yaml and plan.yaml."""
        return sum(len(text.encode()) for text in self.files.values())

    @property
    def configmap_name(self) -> str:
        return f"{self.name}-rundir"

    @property
    def rendezvous_host(self) -> str:
        """Pod 0's stable DNS name: ``<jobset>-<replicated job>-<job index>-<pod index>``
        under the headless service named after the JobSet."""
        return f"{self.name}-{REPLICATED_JOB}-0-0.{self.name}"

    @property
    def node_count(self) -> str:
        return str(self.nnodes) if self.min_nnodes is None else f"{self.min_nnodes}:{self.nnodes}"


def default_name(cfg: DtrainConfig) -> str:
    """``run.name``, or ``<recipe>-<timestamp>`` made a DNS label (gpt_small -> gpt-small)."""
    if cfg.run.name:
        return cfg.run.name
    recipe = re.sub(r"[^a-z0-9-]+", "-", cfg.run.recipe.lower()).strip("-") or "run"
    if not recipe[0].isalpha():
        recipe = f"run-{recipe}"
    return f"{recipe[:30]}-{time.strftime('%Y%m%d-%H%M%S')}"


def pod_config(cfg: DtrainConfig, name: str) -> DtrainConfig:
    """The config the pods read: the run dir under ``cluster.run_root``, no import roots of
    this machine (the pods import from the image)."""
    out = copy.deepcopy(cfg)
    out.run.root, out.run.name, out.run.import_roots = cfg.cluster.run_root, name, []
    return out


def job_from_plan(cfg: DtrainConfig, plan: Plan, name: str) -> K8sJob:
    """``cfg``: the config the pods read (:func:`pod_config`)."""
    c = cfg.cluster
    low = plan.elastic.min_nnodes if plan.elastic is not None else None
    nodes = f"{low}:{plan.nnodes}" if low is not None else str(plan.nnodes)
    return K8sJob(
        name=name,
        kind=c.k8s_kind,
        image=c.image or "",
        python=c.python or "python",
        nnodes=plan.nnodes,
        min_nnodes=low,
        nproc_per_node=plan.nproc_per_node,
        gpus_per_node=c.gpus_per_node,
        run_dir=f"{c.run_root.rstrip('/')}/{name}",
        port=c.rdzv_port or DEFAULT_PORT,
        grace_period_s=c.grace_period_s or grace_estimate_s(cfg, plan),
        max_restarts=plan.max_restarts,
        files={CONFIG_FILE: config_to_yaml(cfg), PLAN_FILE: plan.to_yaml()},
        summary=(
            f"run {name} (recipe {plan.recipe}): {nodes} node(s) x {plan.nproc_per_node} "
            f"process(es), {plan.device}/{plan.backend}, {plan.steps} steps"
        ),
        cluster=c,
    )


GRACE_WARN_S = 900
"""An estimated grace period past this is said (a drain waits it out for a stuck pod)."""


def grace_estimate_s(cfg: DtrainConfig, plan: Plan) -> int:
    """Seconds from SIGTERM to a saved checkpoint: ``logging.every`` estimated steps (the
    stop comes at a logging step), the checkpoint's bytes (fp32 weights and optimizer
    state, every shard) at ``cluster.storage_gbps``, and :data:`GRACE_MARGIN_S`."""
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.steptime import estimate_step

    step_s = estimate_step(cfg, model_spec(cfg), plan, cfg.hardware).step_s
    words = OPTIMIZER_WORDS.get(cfg.optim.name, 2)
    if cfg.optim.name == "sgd" and cfg.optim.momentum == 0:
        words = 0
    checkpoint_bytes = plan.estimates.num_params * 4 * (1 + words)
    write_s = checkpoint_bytes / (cfg.cluster.storage_gbps * 1e9)
    return math.ceil(GRACE_MARGIN_S + cfg.logging.every * step_s + write_s)


def agent_args(job: K8sJob, node_rank: str, endpoint: str, rdzv_id: str) -> list[str]:
    """``dtrain agent``'s arguments in every pod; ``node_rank``/``endpoint``/``rdzv_id``
    carry the ``$(VAR)`` references Kubernetes expands from the container's environment.
    One node needs no rendezvous endpoint (a free local port)."""
    args = ["agent", job.run_dir, "--nnodes", job.node_count]
    if job.nnodes > 1:
        args += ["--node-rank", node_rank, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    return [*args, "--init-from", CONFIG_MOUNT]


def name_problems(name: str, nnodes: int) -> list[str]:
    """A JobSet name: a DNS-1035 label short enough that its longest pod name
    (``<name>-node-0-<last index>-abcde``) stays within 63 characters (JobSet's webhook)."""
    most = 63 - len(f"-{REPLICATED_JOB}-0-{nnodes - 1}") - POD_SUFFIX
    if not DNS_1035.match(name):
        return [
            f"run.name={name!r}: not a DNS label for the JobSet (lowercase letters, digits "
            "and '-', starting with a letter); e.g. run.name=gpt-small-1"
        ]
    if len(name) > most:
        return [
            f"run.name={name!r}: {len(name)} characters; the pods' names "
            f"({name}-{REPLICATED_JOB}-0-{nnodes - 1}-xxxxx) must fit in 63, so use at "
            f"most {most}"
        ]
    return []


def cluster_problems(cfg: DtrainConfig, name: str) -> list[str]:
    """What the cluster would refuse, known before the plan; one line each (exit 2)."""
    c, par = cfg.cluster, cfg.parallel
    problems = name_problems(name, par.nnodes)
    if not c.image:
        problems.append(
            "cluster.image is not set: the container image with dtrain installed, e.g. "
            "cluster.image=registry.example/team/train:1.0"
        )
    if c.k8s_kind == "trainjob" and par.min_nnodes is not None and par.min_nnodes < par.nnodes:
        problems.append(
            f"parallel.nnodes={par.min_nnodes}:{par.nnodes} with cluster.k8s_kind=trainjob: "
            "Kubeflow Trainer has no elastic TrainJob; use cluster.k8s_kind=jobset or a "
            "node count"
        )
    for key in c.env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            problems.append(f"cluster.env: {key!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        elif key in POD_SET or key.startswith("PET_"):  # a later entry of a name wins
            problems.append(
                f"cluster.env.{key}: set by dtrain in every pod ({', '.join(POD_SET)} and "
                "Kubeflow's PET_*); a value here would replace dtrain's (the node rank, ...)"
            )
    return problems + resource_problems(c) + spec_problems(c)


POD_OWNED = {
    "containers": "the agent's container",
    "volumes": "the run dir, the ConfigMap, /dev/shm",
    "restartPolicy": "Never: the JobSet restarts the group",
    "subdomain": "JobSet's: the pods' DNS names",
    "hostname": "JobSet's: the pods' DNS names",
    "terminationGracePeriodSeconds": "cluster.grace_period_s",
    "serviceAccountName": "cluster.service_account",
}
"""Pod spec fields dtrain (or JobSet) sets, and where to set what they say."""
CONTAINER_OWNED = {
    "name": "the replicated job's",
    "image": "cluster.image",
    "command": "the agent",
    "args": "the agent's, from the plan",
    "env": "cluster.env",
    "ports": "the rendezvous",
    "resources": "cluster.gpus_per_node, cpus_per_task, mem",
    "volumeMounts": "the run dir, the ConfigMap, /dev/shm",
}
"""Container fields dtrain sets, and where to set what they say."""
SECRET_NAME = re.compile(
    r"((^|_)(API_?KEY|KEY|TOKEN|SECRET|CREDENTIALS?)$|PASSWORD$|PASSWD$|^SECRET_)",
    re.IGNORECASE,
)
"""A variable named like a secret (WANDB_API_KEY, HF_TOKEN; not TOKENIZERS_PARALLELISM)."""


TRAINJOB_PATCH = {
    "cluster.pod_spec": ("affinity", "imagePullSecrets", "nodeSelector", "schedulingGates",
                         "securityContext", "tolerations"),
    "cluster.container_spec": ("securityContext",),
}  # fmt: skip
"""What a TrainJob's ``runtimePatches`` may set of a pod and a container (Trainer v2.3)."""


def spec_problems(c: ClusterConfig) -> list[str]:
    """``cluster.pod_spec`` / ``container_spec`` keys dtrain sets itself: a value there
    would replace the run's (its command, its volumes); under a TrainJob, keys its runtime
    patch does not take."""
    problems = []
    for key, given in (
        ("cluster.pod_spec", c.pod_spec),
        ("cluster.container_spec", c.container_spec),
    ):
        allowed = TRAINJOB_PATCH[key]
        if c.k8s_kind == "trainjob" and (other := [k for k in given if k not in allowed]):
            problems.append(
                f"{key}: {', '.join(other)} cannot be set on a TrainJob's pods (its runtime "
                f"patch takes {', '.join(allowed)}); use cluster.k8s_kind=jobset"
            )
    for key, given, owned in (
        ("cluster.pod_spec", c.pod_spec, POD_OWNED),
        ("cluster.container_spec", c.container_spec, CONTAINER_OWNED),
    ):
        if taken := [k for k in given if k in owned]:
            where = "; ".join(f"{k}: {owned[k]}" for k in taken)
            problems.append(
                f"{key}: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set by dtrain "
                f"({where}); {key} adds what dtrain does not set, e.g. "
                + (
                    "{tolerations: [...], nodeSelector: {...}}"
                    if key.endswith("pod_spec")
                    else "{securityContext: {...}, envFrom: [{secretRef: {name: wandb}}]}"
                )
            )
    return problems


def resource_problems(c: ClusterConfig) -> list[str]:
    """The ``cluster`` values shared with ``dtrain sbatch`` that a pod spec carries."""
    from dtrain_cli.launch.slurm import MEM_RE

    problems = []
    for key, value, low, high in (
        ("gpus_per_node", c.gpus_per_node, 0, 2**31 - 1),
        ("cpus_per_task", c.cpus_per_task, 1, 2**31 - 1),
        ("rdzv_port", c.rdzv_port, 0, 65535),
        ("grace_period_s", c.grace_period_s, 1, 2**31 - 1),
    ):
        if value is not None and not low <= value <= high:
            problems.append(f"cluster.{key}={value}: must be in [{low}, {high}]")
    if c.mem is not None and not MEM_RE.match(c.mem):
        problems.append(f"cluster.mem={c.mem!r}: use a size such as 480G or 500M (binary units)")
    return problems


def job_problems(job: K8sJob, plan: Plan) -> list[str]:
    """What the run could not do as planned, one line each (exit 2)."""
    problems = []
    if plan.script is not None:
        problems.append(
            "dtrain k8s runs recipes; your own script (-- train.py) is not supported on "
            "Kubernetes yet (dtrain sbatch and dtrain run are)"
        )
    if job.nnodes > 1 and job.cluster.pvc is None:
        # each pod's emptyDir: the first save (often the last, at the end) found the other
        # nodes' shards missing and the run failed after training (a platform engineer's find)
        problems.append(
            f"parallel.nnodes={job.nnodes} without cluster.pvc: each pod's run dir would be its "
            "own emptyDir, which the nodes cannot share a checkpoint through (a save fails, a "
            "restart finds none); set cluster.pvc=CLAIM, a ReadWriteMany claim every pod mounts"
        )
    size = job.files_bytes
    if size > CONFIGMAP_MAX_BYTES:
        problems.append(
            f"config.yaml + plan.yaml are {size:,} bytes; a ConfigMap holds at most 1 MiB"
        )
    return problems


APPLY_ANNOTATION_BYTES = 256 * 1024
"""kubectl's client-side apply keeps the whole object in an annotation of at most this."""


def _gib(size: str, bare: str) -> float:
    """A size in GiB: a Kubernetes quantity (``cluster.shm_size``: 64Gi, 512M, bytes when
    bare) or a SLURM size (``cluster.mem``: 480G in binary units, MiB when bare): ``bare``
    is the unit of a bare number."""
    m = re.match(r"^([0-9.]+)\s*([kKMGTPE]?)(i?)$", size.strip())
    if not m:
        return 0.0
    number, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    if not unit:
        return number * {"B": 1 / 1024**3, "M": 1 / 1024}[bare]
    power = "KMGTPE".index(unit) + 1
    base = 1024 if binary or bare == "M" else 1000  # SLURM's units are binary
    return number * base**power / 1024**3


def job_warnings(job: K8sJob) -> list[str]:
    """Things that work, but maybe not as the user expects."""
    c, out = job.cluster, []
    if c.pvc is None:
        out.append(
            "cluster.pvc is not set: the pod's run dir is an emptyDir, lost when the pod "
            "ends, so a restart starts over; set cluster.pvc=CLAIM"
        )
    if c.setup:
        out.append("cluster.setup is SLURM's: pods run the image as it is (put it in the image)")
    size = job.files_bytes
    if APPLY_ANNOTATION_BYTES < size <= CONFIGMAP_MAX_BYTES:
        out.append(
            f"config.yaml + plan.yaml are {size:,} bytes: past the 256 KiB that client-side "
            "`kubectl apply` keeps in its last-applied annotation (it refuses the ConfigMap); "
            "use `kubectl apply --server-side -f FILE` or --submit"
        )
    if c.shm_size and c.mem and _gib(c.shm_size, "B") > _gib(c.mem, "M"):
        out.append(
            f"cluster.shm_size={c.shm_size} is more than the pod's memory (cluster.mem={c.mem}): "
            "/dev/shm counts against it, so the pod is OOM-killed before the size is reached"
        )
    if secret := [k for k in sorted(c.env) if SECRET_NAME.search(k)]:
        out.append(
            f"cluster.env.{secret[0]}: written as plain text in the ConfigMap, the pod spec and "
            "the run dir's config.yaml; give a secret through a Kubernetes Secret: "
            "'cluster.container_spec={envFrom: [{secretRef: {name: SECRET}}]}'"
        )
    if c.grace_period_s is None and job.grace_period_s > GRACE_WARN_S:
        out.append(
            f"terminationGracePeriodSeconds={job.grace_period_s:,} (estimated: logging.every "
            "steps and a checkpoint write): a drain or preemption waits that long for a pod "
            "that does not stop; lower logging.every, or set cluster.grace_period_s"
        )
    if job.kind == "trainjob" and job.max_restarts:
        out.append(
            f"launcher.max_restarts={job.max_restarts}: a TrainJob's restarts are its "
            f"runtime's ({c.trainjob_runtime}); here it only restarts workers inside a pod"
        )
    return out
