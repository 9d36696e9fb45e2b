"""The cluster side of ``dtrain k8s``: create, follow, status, logs, cancel, through the
``kubernetes`` client and the current kube-context (``--context`` picks another).

    dtrain k8s recipe=gpt_small cluster.image=registry.example/team/train:1.0 --submit
    dtrain k8s status NAME;  dtrain k8s logs NAME --rank 1;  dtrain k8s cancel NAME

The client is imported here only (``pip install 'dtrain[k8s]'``): ``--dry-run`` and
``--out`` need neither it nor a cluster. Every failure is one :class:`KubeError` line.
Nothing is left half-created: the ConfigMap is created first (the pods mount it), then
the JobSet; when the JobSet's creation fails the ConfigMap is deleted, and once the JobSet
exists it owns the ConfigMap (``ownerReferences``), so deleting the JobSet deletes both.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dtrain_cli.launch.k8s.job import JOBSET_API, REPLICATED_JOB, TRAINJOB_API

REQUEST_TIMEOUT = (10, 60)
"""(connect, read) seconds of every API call but a followed log."""
POLL_S = 2.0
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
APIS = {"JobSet": JOBSET_API, "TrainJob": TRAINJOB_API}
DONE = {"Completed": 0, "Complete": 0, "Failed": 1}
"""Terminal conditions (JobSet: Completed, TrainJob: Complete) -> exit code."""


class KubeError(Exception):
    """One line for the user; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@dataclass(kw_only=True)
class Cluster:
    """The API clients of one kube-context, and the namespace commands act in."""

    core: Any
    custom: Any
    namespace: str
    host: str


def connect(context: str | None = None, namespace: str | None = None) -> Cluster:
    """The kube-context (``KUBECONFIG`` or ~/.kube/config; in a pod, its service account)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise KubeError(
            "the kubernetes client is not installed: pip install 'dtrain[k8s]'"
        ) from None
    files = os.environ.get("KUBECONFIG")  # read now: the client reads it at its import
    try:
        config.load_kube_config(config_file=files, context=context)
        contexts, active = config.list_kube_config_contexts(config_file=files)
        chosen = next((c for c in contexts if c["name"] == context), active)
        default_ns = chosen.get("context", {}).get("namespace", "default")
    except (config.ConfigException, OSError) as exc:
        try:  # inside a pod of the cluster: its service account
            config.load_incluster_config()
            default_ns = "default"
        except config.ConfigException:
            raise KubeError(
                f"no kube-context ({exc}): set KUBECONFIG or ~/.kube/config, or pick one "
                "with --context; --dry-run and --out need no cluster"
            ) from None
    api = client.ApiClient()
    return Cluster(
        core=client.CoreV1Api(api),
        custom=client.CustomObjectsApi(api),
        namespace=namespace or default_ns,
        host=api.configuration.host,
    )


def call(kc: Cluster, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One API call; transport and API errors become a :class:`KubeError` naming ``what``."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        err = KubeError(f"{what}: {api_message(exc)}")
        err.status = exc.status  # type: ignore[attr-defined]
        raise err from None
    except urllib3.exceptions.HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise KubeError(f"cannot reach the cluster at {kc.host} ({reason})") from None


def api_message(exc: Any) -> str:
    """The API server's own message (a Status object's ``message``) and the HTTP status."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{message or exc.reason} (HTTP {exc.status})"


def status_of(err: KubeError) -> int | None:
    return getattr(err, "status", None)


def create(kc: Cluster, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ConfigMap, then the JobSet/TrainJob (which then owns the ConfigMap). A failure
    of the second deletes the first. Returns the created JobSet/TrainJob."""
    configmap, main = (_in_namespace(d, kc.namespace) for d in docs)
    cm_name, kind, name = configmap["metadata"]["name"], main["kind"], main["metadata"]["name"]
    try:
        call(
            kc,
            f"ConfigMap {cm_name}",
            kc.core.create_namespaced_config_map,
            kc.namespace,
            configmap,
        )
    except KubeError as err:
        if status_of(err) == 409:
            raise KubeError(
                f"ConfigMap {cm_name} already exists in namespace {kc.namespace}: run.name={name} "
                f"is taken; choose another run.name (or dtrain k8s cancel {name})"
            ) from None
        raise
    group, version, plural = APIS[kind]
    try:
        created = call(
            kc,
            f"{kind} {name}",
            kc.custom.create_namespaced_custom_object,
            group,
            version,
            kc.namespace,
            plural,
            main,
            # a controller older than the manifest (a JobSet CRD before v0.10 lacks
            # onJobFailureMessagePatterns) refuses it, rather than dropping the field
            field_validation="Strict",
        )
    except KubeError as err:
        undone = _delete_quietly(kc, cm_name)
        hint = ""
        if status_of(err) == 404:
            hint = f"; is the {kind} API ({group}/{version}) installed in this cluster?"
        raise KubeError(f"{err}{hint}; {undone}") from None
    owner = {
        "apiVersion": main["apiVersion"],
        "kind": kind,
        "name": name,
        "uid": created["metadata"]["uid"],
    }
    patch = {"metadata": {"ownerReferences": [owner]}}
    try:
        call(
            kc,
            f"ConfigMap {cm_name}",
            kc.core.patch_namespaced_config_map,
            cm_name,
            kc.namespace,
            patch,
        )
    except KubeError as err:  # the run is fine; only `cancel` must delete the ConfigMap too
        print(f"warning: {err}: ConfigMap not owned by the {kind}", file=sys.stderr)
    return created


def _in_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}


def _delete_quietly(kc: Cluster, cm_name: str) -> str:
    try:
        call(
            kc, f"ConfigMap {cm_name}", kc.core.delete_namespaced_config_map, cm_name, kc.namespace
        )
    except KubeError as err:
        return f"and deleting ConfigMap {cm_name} failed too ({err}): delete it by hand"
    return f"ConfigMap {cm_name} deleted (nothing was left behind)"


def find(kc: Cluster, name: str) -> dict[str, Any]:
    """The JobSet NAME, else the TrainJob NAME."""
    for kind, (group, version, plural) in APIS.items():
        try:
            return call(
                kc,
                f"{kind} {name}",
                kc.custom.get_namespaced_custom_object,
                group,
                version,
                kc.namespace,
                plural,
                name,
            )
        except KubeError as err:
            if status_of(err) != 404:
                raise
    raise KubeError(f"no JobSet or TrainJob {name} in namespace {kc.namespace}")


def state(obj: dict[str, Any]) -> tuple[str, str]:
    """(state, message): the newest true terminal or Suspended condition, else Running."""
    conditions = [
        c for c in obj.get("status", {}).get("conditions", []) if c.get("status") == "True"
    ]
    for cond in reversed(conditions):
        if cond.get("type") in DONE or cond.get("type") == "Suspended":
            return cond["type"], cond.get("message", "")
    return ("Running" if obj.get("status") else "Pending"), ""


def pods(kc: Cluster, name: str, rank: int | None = None) -> list[dict[str, Any]]:
    """The run's pods (of node ``rank``), newest restart attempt last."""
    selector = f"{JOBSET_NAME_LABEL}={name}"
    if rank is not None:
        selector += f",{INDEX_LABEL}={rank}"
    found = call(kc, "pods", kc.core.list_namespaced_pod, kc.namespace, label_selector=selector)
    items = [kc.core.api_client.sanitize_for_serialization(p) for p in found.items]

    def key(pod: dict[str, Any]) -> tuple[int, int, str]:
        lab = pod["metadata"].get("labels", {})
        return (
            int(lab.get(RESTART_LABEL, 0)),
            int(lab.get(INDEX_LABEL, 0)),
            pod["metadata"].get("creationTimestamp", ""),
        )

    return sorted(items, key=key)


def status_lines(kc: Cluster, name: str) -> tuple[list[str], str]:
    """What ``dtrain k8s status`` prints, and the state."""
    obj = find(kc, name)
    now, message = state(obj)
    st = obj.get("status", {})
    lines = [
        f"{obj['kind']} {name} in namespace {kc.namespace}: {now}"
        + (f" ({message})" if message else "")
    ]
    if obj["kind"] == "JobSet":
        limit = obj["spec"].get("failurePolicy", {}).get("maxRestarts", 0)
        lines.append(f"  restarts: {st.get('restarts', 0)} of maxRestarts {limit}")
    if now == "Suspended":
        lines.append("  suspended: waiting for admission (a Kueue queue admits all pods at once)")
    for pod in pods(kc, name):
        lab = pod["metadata"].get("labels", {})
        phase = pod.get("status", {}).get("phase", "Pending")
        lines.append(
            f"  node {lab.get(INDEX_LABEL, '?')}: {pod['metadata']['name']} {phase} "
            f"(restart attempt {lab.get(RESTART_LABEL, 0)})"
        )
    return lines, now


def write_logs(kc: Cluster, pod: str, follow: bool, out: Callable[[str], None]) -> None:
    """The pod's console (its agent: rank 0's progress on node 0; every rank's own log is
    in the run dir, logs/rank_<k>.log)."""
    timeout = None if follow else REQUEST_TIMEOUT
    resp = call(
        kc,
        f"logs of pod {pod}",
        kc.core.read_namespaced_pod_log,
        pod,
        kc.namespace,
        container=REPLICATED_JOB,
        follow=follow,
        _preload_content=False,
        _request_timeout=timeout,
    )
    for chunk in resp.stream(4096):
        out(chunk.decode(errors="replace"))
    resp.release_conn()


def follow(kc: Cluster, name: str, out: Callable[[str], None]) -> int:
    """Rank 0's console through every restart until the run ends; its exit code (0 when
    it completed). Ctrl-C stops following, not the run."""
    seen: set[str] = set()
    while True:
        now, message = state(find(kc, name))
        node0 = [p for p in pods(kc, name, 0) if p["metadata"]["uid"] not in seen]
        started = [p for p in node0 if p.get("status", {}).get("phase") not in (None, "Pending")]
        if started:
            pod = started[-1]["metadata"]
            seen.add(pod["uid"])
            out(f"--- dtrain k8s: logs of {pod['name']} (node 0)\n")
            write_logs(kc, pod["name"], True, out)
        elif now in DONE:
            out(f"--- dtrain k8s: {name} {now}" + (f": {message}" if message else "") + "\n")
            return DONE[now]
        else:
            time.sleep(POLL_S)


def cancel(kc: Cluster, name: str) -> list[str]:
    """Delete the JobSet/TrainJob (its pods go with it) and its ConfigMap; the run dir on
    the volume stays (its checkpoints). Returns what was deleted."""
    obj = find(kc, name)
    group, version, plural = APIS[obj["kind"]]
    call(
        kc,
        f"{obj['kind']} {name}",
        kc.custom.delete_namespaced_custom_object,
        group,
        version,
        kc.namespace,
        plural,
        name,
        propagation_policy="Foreground",
    )
    done = [f"{obj['kind']} {name}"]
    try:
        call(kc, "ConfigMap", kc.core.delete_namespaced_config_map, f"{name}-rundir", kc.namespace)
        done.append(f"ConfigMap {name}-rundir")
    except KubeError as err:
        if status_of(err) != 404:  # 404: its owner's deletion took it already
            raise
    return done
