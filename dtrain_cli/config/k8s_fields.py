"""The form of the ``cluster`` group's Kubernetes values, one line per problem. Torch-free.

    dtrain k8s recipe=gpt_small cluster.image='train:1.0; rm -rf /' --dry-run   # exit 2

Each value lands in a manifest as one YAML scalar (an image, a label value, an object
name, a resource quantity): the patterns are the API server's own (DNS-1123 names, label
values, quantities, image references), so a value with shell or YAML metacharacters, a
newline or a space is refused here rather than by the cluster. Checks that need the plan
(an image is given, the GPUs match the processes, the name fits the pods' names) are in
:mod:`dtrain_cli.launch.k8s.job`.
"""

from __future__ import annotations

import re

from dtrain_cli.config.schema import ClusterConfig
from dtrain_cli.config.suggest import not_allowed

K8S_KINDS = ("jobset", "trainjob")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
"""RFC 1123 label (namespace), at most 63 characters."""
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
"""RFC 1123 subdomain (claims, service accounts, runtimes), at most 253 characters."""
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
IMAGE = re.compile(  # a registry is a host (a dot, a port, localhost); the path lower case
    r"^(?:(?:[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+(?::[0-9]+)?|[a-zA-Z0-9-]+:[0-9]+|localhost)/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"  # path components
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # :tag
    r"(?:@sha256:[0-9a-f]{64})?$"  # @digest
)
RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
MOUNT_PATH = re.compile(r"^(/[A-Za-z0-9._-]+)+$")
SYSTEM_FOLDERS = ("/etc/dtrain/", "/dev/", "/proc/", "/sys/")
IMAGE_FOLDERS = ("/", "/usr", "/usr/local", "/bin", "/lib", "/lib64", "/etc", "/opt", "/sbin")
"""Folders a mount would hide the image's Python and system in (their subfolders are fine)."""
"""Where a run dir's volume may not be mounted: dtrain's ConfigMap (/etc/dtrain), /dev/shm
(a second mount at the same path is refused by the API server) and the kernel's."""


def k8s_field_problems(c: ClusterConfig) -> list[str]:
    """The Kubernetes values that are set, checked for their form (exit 2 in the CLI)."""
    problems = []
    if c.k8s_kind not in K8S_KINDS:
        problems.append(not_allowed("cluster.k8s_kind", c.k8s_kind, K8S_KINDS))
    if c.image is not None and (len(c.image) > 255 or not IMAGE.match(c.image)):
        problems.append(
            f"cluster.image={c.image!r}: not an image reference; use REGISTRY/PATH:TAG, "
            "e.g. registry.example/team/train:1.0"
        )
    problems += _name("cluster.namespace", c.namespace, DNS_LABEL, 63, "team-a")
    # a LocalQueue's name, carried as a label value: a DNS-1123 subdomain of <= 63 characters
    problems += _name("cluster.queue", c.queue, DNS_SUBDOMAIN, 63, "team-a-queue")
    problems += _name("cluster.pvc", c.pvc, DNS_SUBDOMAIN, 253, "train-runs")
    problems += _name("cluster.service_account", c.service_account, DNS_SUBDOMAIN, 253, "trainer")
    problems += _name(
        "cluster.trainjob_runtime", c.trainjob_runtime, DNS_SUBDOMAIN, 253, "torch-distributed"
    )
    if c.shm_size is not None and not QUANTITY.match(c.shm_size):
        problems.append(
            f"cluster.shm_size={c.shm_size!r}: not a Kubernetes quantity; e.g. 64Gi or 512Mi"
        )
    if not MOUNT_PATH.match(c.run_root) or "/../" in f"{c.run_root}/" or "/./" in f"{c.run_root}/":
        problems.append(
            f"cluster.run_root={c.run_root!r}: not an absolute folder path of letters, digits "
            "and . _ -; e.g. /runs"
        )
    elif f"{c.run_root}/".startswith(SYSTEM_FOLDERS) or c.run_root.rstrip("/") in IMAGE_FOLDERS:
        # a second mount at /etc/dtrain or /dev/shm: the API server refuses the pod
        problems.append(
            f"cluster.run_root={c.run_root!r}: a folder dtrain or the kernel mounts "
            f"({', '.join(f.rstrip('/') for f in SYSTEM_FOLDERS)}), or one the image's "
            "Python lives in (/usr, /usr/local, /bin, /lib, /etc, /opt); e.g. /runs"
        )
    if not RESOURCE_NAME.match(c.gpu_resource):
        problems.append(
            f"cluster.gpu_resource={c.gpu_resource!r}: not an extended resource name; "
            "e.g. nvidia.com/gpu or amd.com/gpu"
        )
    if c.grace_period_s is not None and c.grace_period_s < 1:
        problems.append(f"cluster.grace_period_s={c.grace_period_s}: must be >= 1 (or unset)")
    if not c.storage_gbps > 0:
        problems.append(f"cluster.storage_gbps={c.storage_gbps}: must be > 0")
    return problems


def _name(key: str, value: str | None, pattern: re.Pattern, most: int, example: str) -> list[str]:
    if value is None or (len(value) <= most and pattern.match(value)):
        return []
    kind = "a DNS label" if pattern is DNS_LABEL else "a DNS-1123 name"
    return [
        f"{key}={value!r}: not {kind} (lowercase letters, digits, '-'"
        + ("" if pattern is DNS_LABEL else ", '.'")
        + f"; at most {most} characters); e.g. {example}"
    ]
