"""kube-local: run the pods of a JobSet manifest as local processes, with exactly the
command, arguments and environment the manifest gives each pod, under the rules of the
Job and JobSet controllers. A test helper: no API server runs on this machine.

    cluster = KubeLocal(manifest_text, tmp_path, image_env={"PATH": ..., "PYTHONPATH": ...})
    result = cluster.run(timeout=300, chaos=lambda c: ...)   # Completed / Failed, restarts

What stands in for what:
- the image: ``image_env`` (its ENV: PATH with the Python that has dtrain, PYTHONPATH);
  the kubelet's own variables are added (``KUBERNETES_SERVICE_HOST``/``_PORT``,
  ``HOSTNAME``) and the Job controller's ``JOB_COMPLETION_INDEX``;
- ``env[].valueFrom.fieldRef``: resolved for each pod (its completion index, the JobSet's
  restart attempt, its name); ``$(VAR)`` in command and args expanded as Kubernetes does
  (``$$`` escapes, unknown names stay);
- volumes: a ConfigMap's keys become files in a folder, a PersistentVolumeClaim one folder
  all pods share (and keep across restarts), an emptyDir a fresh folder per pod; a path
  under a mount is rewritten to the folder (a mount at /dev/shm stays /dev/shm);
- the network: the pods' DNS names (``<jobset>-<rjob>-<job index>-<pod index>.<subdomain>``)
  are 127.0.0.1 and every declared containerPort a free local port;
- the controllers: an Indexed Job of ``completions`` pods; a failed pod fails the Job once
  ``backoffLimit`` failures are exceeded (a pod replaced before that), with reason
  ``PodFailurePolicy`` when a ``FailJob`` rule of its ``podFailurePolicy`` matches (an exit
  code, or the DisruptionTarget condition of a deleted pod), else ``BackoffLimitExceeded``;
  the JobSet's ``failurePolicy.rules`` pick the action (default RestartJobSet) by the Job's
  failure reason and message (the Job controller's words: "... failed with exit code 2
  matching FailJob rule at index 0"), a restart
  counts against ``maxRestarts`` unless the action ignores it, and (BlockingRecreate) every
  pod gets SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds``, before the next
  attempt starts with ``restart-attempt`` + 1. ``successPolicy: All``: every pod exits 0.
Not modelled: scheduling, Kueue, DNS propagation delays, CEL rules, webhooks (see
docs/kubernetes.md). Anything the helper does not know (another fieldRef, several
replicated jobs or containers) raises, so a manifest change cannot pass unnoticed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
KUBELET_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command, args and env values."""
    return VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


@dataclass
class Pod:
    index: int
    attempt: int
    proc: subprocess.Popen
    log: Path
    disrupted: bool = False
    deadline: float | None = None
    """Deleted: SIGKILL after this (monotonic) time."""


@dataclass
class Result:
    state: str
    """Completed | Failed."""
    restarts: int = 0
    restarts_counted: int = 0
    """Those that count against maxRestarts."""
    exits: list[dict[int, int]] = field(default_factory=list)
    """Per attempt: pod index -> exit code (the last pod of that index)."""
    logs: list[Path] = field(default_factory=list)


class KubeLocal:
    def __init__(self, manifest: str, root: Path, image_env: dict[str, str]) -> None:
        docs = list(yaml.safe_load_all(manifest))
        self.configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
        (self.jobset,) = [d for d in docs if d["kind"] == "JobSet"]
        spec = self.jobset["spec"]
        (rjob,) = spec["replicatedJobs"]  # one replicated job of one Job: what dtrain emits
        assert rjob.get("replicas", 1) == 1
        self.name, self.rjob = self.jobset["metadata"]["name"], rjob["name"]
        self.subdomain = spec.get("network", {}).get("subdomain", self.name)
        self.job = rjob["template"]["spec"]
        assert self.job["completionMode"] == "Indexed"
        assert self.job["parallelism"] == self.job["completions"]
        self.pod_spec = self.job["template"]["spec"]
        assert self.pod_spec["restartPolicy"] == "Never"
        (self.container,) = self.pod_spec["containers"]
        self.root, self.image_env = root, image_env
        self.attempt = 0
        self.pods: dict[int, Pod] = {}
        self.ports = {p["containerPort"]: free_port() for p in self.container.get("ports", [])}
        self.shared = self._shared_volumes()

    # ---- what a pod sees
    def hostname(self, index: int) -> str:
        return f"{self.name}-{self.rjob}-0-{index}"

    def _shared_volumes(self) -> dict[str, Path]:
        """ConfigMaps and claims: the same folder for every pod and attempt."""
        out = {}
        for vol in self.pod_spec.get("volumes", []):
            if "configMap" in vol:
                folder = self.root / "configmaps" / vol["configMap"]["name"]
                folder.mkdir(parents=True, exist_ok=True)
                for key, text in self.configmaps[vol["configMap"]["name"]]["data"].items():
                    (folder / key).write_text(text)
                out[vol["name"]] = folder
            elif "persistentVolumeClaim" in vol:
                folder = self.root / "pvc" / vol["persistentVolumeClaim"]["claimName"]
                folder.mkdir(parents=True, exist_ok=True)
                out[vol["name"]] = folder
            else:
                assert set(vol) == {"name", "emptyDir"}, f"kube-local: volume {vol}"
        return out

    def mounts(self, index: int) -> dict[str, Path]:
        """mountPath -> local folder for pod ``index`` of this attempt."""
        out = {}
        for m in self.container.get("volumeMounts", []):
            if m["mountPath"] == "/dev/shm":
                continue
            folder = self.shared.get(m["name"])
            if folder is None:  # an emptyDir: this pod's, this attempt's
                folder = self.root / f"attempt-{self.attempt}" / f"pod-{index}" / m["name"]
                folder.mkdir(parents=True, exist_ok=True)
            out[m["mountPath"]] = folder
        return out

    def localize(self, text: str, mounts: dict[str, Path]) -> str:
        """A pod's paths and addresses as this machine's."""
        for path, folder in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            text = re.sub(rf"(?<![\w/.-]){re.escape(path)}(?=/|$)", str(folder), text)
        for i in range(self.job["completions"]):
            host = re.escape(f"{self.hostname(i)}.{self.subdomain}")
            for port, local in self.ports.items():
                text = re.sub(rf"\b{host}:{port}\b", f"127.0.0.1:{local}", text)
        return text

    def field_value(self, path: str, index: int) -> str:
        values = {
            "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
            "metadata.labels['batch.kubernetes.io/job-completion-index']": str(index),
            "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']": str(self.attempt),
            "metadata.labels['jobset.sigs.k8s.io/restart-attempt']": str(self.attempt),
            "metadata.name": f"{self.hostname(index)}-{self.attempt}",
            "metadata.namespace": "default",
        }
        if path not in values:
            raise KeyError(f"kube-local: fieldRef {path} is not modelled")
        return values[path]

    def pod_env(self, index: int, mounts: dict[str, Path]) -> dict[str, str]:
        env = {**self.image_env, **KUBELET_ENV, "HOSTNAME": self.hostname(index)}
        env["JOB_COMPLETION_INDEX"] = str(index)
        for var in self.container.get("env", []):
            if "valueFrom" in var:
                (kind,) = var["valueFrom"]
                assert kind == "fieldRef", f"kube-local: {var}"
                value = self.field_value(var["valueFrom"]["fieldRef"]["fieldPath"], index)
            else:
                value = expand(var.get("value", ""), env)
            env[var["name"]] = self.localize(value, mounts)
        return env

    def argv(self, index: int) -> tuple[list[str], dict[str, str]]:
        mounts = self.mounts(index)
        env = self.pod_env(index, mounts)
        words = [*self.container.get("command", []), *self.container.get("args", [])]
        return [self.localize(expand(w, env), mounts) for w in words], env

    # ---- the controllers
    def start(self, index: int) -> Pod:
        argv, env = self.argv(index)
        log = self.root / f"attempt-{self.attempt}" / f"pod-{index}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        workdir = self.root / "workdir"
        workdir.mkdir(exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, env=env, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # the container: one process group, killed whole
            )  # fmt: skip
        self.pods[index] = Pod(index, self.attempt, proc, log)
        return self.pods[index]

    def kill(self, index: int) -> None:
        """The container dies at once (OOM kill, a lost node): SIGKILL to all of it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pods[index].proc.pid, signal.SIGKILL)

    def delete(self, index: int) -> None:
        """The cluster deletes the pod (eviction, preemption): DisruptionTarget, SIGTERM to
        the container's main process, SIGKILL after the grace period (run() waits)."""
        pod = self.pods[index]
        pod.disrupted = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(pod.proc.pid, signal.SIGTERM)
        pod.deadline = time.monotonic() + self.pod_spec.get("terminationGracePeriodSeconds", 30)

    def terminate_all(self) -> None:
        """SIGTERM every running container, SIGKILL after the grace period; wait for all."""
        grace = self.pod_spec.get("terminationGracePeriodSeconds", 30)
        for pod in self.pods.values():
            if pod.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pod.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for pod in self.pods.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)  # what is left of the container
            pod.proc.wait()

    def failure_reason(self, pod: Pod) -> tuple[str, str]:
        """(the Job's failure reason, its message as the Job controller words it)."""
        name = f"default/{self.hostname(pod.index)}"
        for index, rule in enumerate(self.job.get("podFailurePolicy", {}).get("rules", [])):
            codes = rule.get("onExitCodes")
            if codes and codes["operator"] == "In" and pod.proc.returncode in codes["values"]:
                assert rule["action"] == "FailJob", f"kube-local: {rule}"
                return "PodFailurePolicy", (
                    f"Container {codes['containerName']} for pod {name} failed with exit code "
                    f"{pod.proc.returncode} matching FailJob rule at index {index}"
                )
            conditions = [c["type"] for c in rule.get("onPodConditions", [])]
            if pod.disrupted and "DisruptionTarget" in conditions:
                assert rule["action"] == "FailJob", f"kube-local: {rule}"
                return "PodFailurePolicy", (
                    f"Pod {name} has condition DisruptionTarget matching FailJob rule at "
                    f"index {index}"
                )
        return "BackoffLimitExceeded", "Job has reached the specified backoff limit"

    def action(self, reason: str, message: str) -> str:
        for rule in self.jobset["spec"].get("failurePolicy", {}).get("rules", []):
            reasons, patterns = (
                rule.get("onJobFailureReasons"),
                rule.get("onJobFailureMessagePatterns"),
            )
            if (not reasons or reason in reasons) and (
                not patterns or any(re.search(p, message) for p in patterns)
            ):
                return rule["action"]
        return "RestartJobSet"

    def run(self, timeout: float, chaos: Callable[[KubeLocal], None] | None = None) -> Result:
        """Attempts until the JobSet completes or fails. ``chaos(self)`` is called while
        pods run (it may :meth:`kill` or :meth:`delete` one)."""
        policy = self.jobset["spec"].get("failurePolicy", {})
        result, deadline = Result("Failed"), time.monotonic() + timeout
        while True:
            self.pods, failures, exits = {}, 0, {}
            for i in range(self.job["completions"]):
                result.logs.append(self.start(i).log)
            failed = None
            while failed is None:  # one pass after the last pod ended: its exit is read too
                running = any(p.proc.poll() is None for p in self.pods.values())
                assert time.monotonic() < deadline, f"kube-local: timeout; logs {result.logs}"
                if chaos is not None:
                    chaos(self)
                for pod in list(self.pods.values()):
                    if pod.deadline is not None and time.monotonic() > pod.deadline:
                        self.kill(pod.index)  # the grace period is over
                    code = pod.proc.poll()
                    if code is not None and code != 0 and pod.index not in exits:
                        exits[pod.index] = code
                        failures += 1
                        reason = self.failure_reason(pod)
                        if reason[0] == "BackoffLimitExceeded" and failures <= self.job.get(
                            "backoffLimit", 6
                        ):
                            del exits[pod.index]  # the Job replaces the pod
                            result.logs.append(self.start(pod.index).log)
                        else:
                            failed = reason
                if not running and all(p.proc.poll() is not None for p in self.pods.values()):
                    break
                time.sleep(0.1)
            self.terminate_all()
            exits.update({p.index: p.proc.returncode for p in self.pods.values()})
            result.exits.append(exits)
            if failed is None and all(code == 0 for code in exits.values()):
                result.state = "Completed"
                return result
            act = self.action(*(failed or ("BackoffLimitExceeded", "")))
            counted = act == "RestartJobSet"
            if act == "FailJobSet" or (
                counted and result.restarts_counted >= policy.get("maxRestarts", 0)
            ):
                return result
            result.restarts += 1
            result.restarts_counted += counted
            self.attempt += 1
