"""A small fake of the Kubernetes API server on 127.0.0.1, for ``dtrain k8s --submit``,
``status``, ``logs`` and ``cancel`` driven through the real ``kubernetes`` client (a
kubeconfig points at it). Test helper.

It serves what dtrain calls: namespaced ConfigMaps (create, get, patch, delete), pods
(list by label selector, a pod's log) and the namespaced custom objects of JobSet and
TrainJob (create, get, delete). Like an API server it validates a created object against
its schema (tests/k8s_schema.py; 422 Invalid), answers 409 to a name that exists, 404 to
one that does not, assigns uids, and deletes a ConfigMap whose owner is deleted (the
garbage collector). ``fail`` makes the next create of a resource fail; ``on_create`` plays
the controllers (pods, conditions) for a test.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.k8s_schema import problems

CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(configmaps|pods)(?:/([^/]+))?(/log)?$")
CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        """(resource plural, namespace, name) -> object."""
        self.requests: list[tuple[str, str]] = []
        self.queries: list[dict[str, list[str]]] = []
        """Each request's query parameters (fieldValidation=Strict ...)."""
        self.fail: dict[str, tuple[int, str]] = {}
        """resource plural -> (HTTP status, message) of its next create."""
        self.on_create: Callable[[FakeKube, dict[str, Any]], None] | None = None
        self.logs: dict[str, str] = {}
        """pod name -> its log."""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeKube:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "team-a") -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "me", "user": {"token": "fake-token"}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {"cluster": "fake", "user": "me", "namespace": namespace},
                        }
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def get(self, plural: str, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
        return self.objects.get((plural, namespace, name))

    def add_pod(self, namespace: str, jobset: str, index: int, phase: str, log: str,
                attempt: int = 0) -> None:  # fmt: skip
        name = f"{jobset}-node-0-{index}-{uuid.uuid4().hex[:5]}"
        labels = {
            "jobset.sigs.k8s.io/jobset-name": jobset,
            "batch.kubernetes.io/job-completion-index": str(index),
            "jobset.sigs.k8s.io/restart-attempt": str(attempt),
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "node", "image": "x"}]},
            "status": {"phase": phase},
        }
        self._store("pods", namespace, pod)
        self.logs[name] = log

    def _store(self, plural: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion="1")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.objects[(plural, namespace, meta["name"])] = obj
        return obj

    def _delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.pop((plural, namespace, name), None)
        if obj is not None:  # the garbage collector: what this object owned goes too
            uid = obj["metadata"]["uid"]
            for key, other in list(self.objects.items()):
                owners = other["metadata"].get("ownerReferences", [])
                if any(o.get("uid") == uid for o in owners):
                    self.objects.pop(key, None)
        return obj

    def handle(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        parsed = urlparse(url)
        self.requests.append((method, parsed.path))
        self.queries.append(parse_qs(parsed.query))
        if m := CORE.match(parsed.path):
            namespace, plural, name, log = m.groups()
        elif m := CUSTOM.match(parsed.path):
            _, _, namespace, plural, name = m.groups()
            log = None
        else:
            return 404, status(404, "NotFound", f"the server could not find {parsed.path}")
        key = (plural, namespace, name)
        if log:
            if key not in self.objects:
                return 404, status(404, "NotFound", f'pods "{name}" not found')
            return 200, self.logs.get(name, "")
        if method == "POST":
            return self._create(plural, namespace, body)
        if name is None and method == "GET":
            return 200, self._list(plural, namespace, parse_qs(parsed.query))
        if key not in self.objects:
            return 404, status(404, "NotFound", f'{plural} "{name}" not found')
        if method == "GET":
            return 200, self.objects[key]
        if method == "PATCH":
            merge(self.objects[key], body)
            return 200, self.objects[key]
        if method == "DELETE":
            self._delete(plural, namespace, name)
            return 200, status(200, "", "") | {"status": "Success"}
        return 405, status(405, "MethodNotAllowed", method)

    def _create(self, plural: str, namespace: str, body: dict[str, Any]) -> tuple[int, Any]:
        if plural in self.fail:
            code, message = self.fail.pop(plural)
            return code, status(code, "Failure", message)
        name = body.get("metadata", {}).get("name", "")
        if (plural, namespace, name) in self.objects:
            return 409, status(409, "AlreadyExists", f'{plural} "{name}" already exists')
        if found := problems(body):
            return 422, status(422, "Invalid", f'{body.get("kind")} "{name}" is invalid: {found}')
        obj = self._store(plural, namespace, json.loads(json.dumps(body)))
        if self.on_create is not None:
            self.on_create(self, obj)
        return 201, obj

    def _list(self, plural: str, namespace: str, query: dict[str, list[str]]) -> dict[str, Any]:
        wanted = dict(
            kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv
        )
        items = [
            obj
            for (p, ns, _), obj in self.objects.items()
            if p == plural
            and ns == namespace
            and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        kind = "PodList" if plural == "pods" else "List"
        return {"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                code, out = fake.handle(self.command, self.path, body)
                text = out if isinstance(out, str) else json.dumps(out)
                self.send_response(code)
                kind = "text/plain" if isinstance(out, str) else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(text.encode())))
                self.end_headers()
                self.wfile.write(text.encode())

            do_GET = do_POST = do_PATCH = do_DELETE = _serve

            def log_message(self, *args: object) -> None:  # quiet
                pass

        return Handler
