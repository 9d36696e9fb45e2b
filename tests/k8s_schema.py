"""Validate Kubernetes documents against the official schemas, as strictly as an API
server's structural-schema checks (not its CEL rules, webhooks or controllers).

Built-in kinds (ConfigMap; the JobSet's Job template as a ``batch/v1`` Job; every custom
object's ``metadata`` as an ObjectMeta): ``kubernetes-validate`` in strict mode (it bundles
the OpenAPI schemas of each Kubernetes release; unknown fields fail). JobSet and TrainJob:
``jsonschema`` against their CRDs' openAPIV3Schema vendored in tests/k8s_schemas/ (see the
``_vendored`` header of each file), made strict the way the API server treats a structural
schema: an object that lists its properties admits no other field (unless it says
``x-kubernetes-preserve-unknown-fields``), ``x-kubernetes-int-or-string`` is an integer or
a string, ``nullable`` admits null.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

SCHEMAS = Path(__file__).parent / "k8s_schemas"
CRDS = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset_v1alpha2.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjob_v1alpha1.json",
}
KUBERNETES_VERSION = "1.33"
"""The release whose built-in schemas kubernetes-validate checks against."""


def structural(node: Any) -> Any:
    """A CRD schema node as a strict JSON Schema (see the module docstring)."""
    if isinstance(node, list):
        return [structural(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: structural(v) for k, v in node.items() if k != "properties"}
    if "properties" in node:  # its keys are field names, not keywords
        out["properties"] = {k: structural(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    doc = json.loads((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    schema = structural(doc["openAPIV3Schema"])
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def vendored(api_version: str, kind: str) -> dict[str, str]:
    return json.loads((SCHEMAS / CRDS[(api_version, kind)]).read_text())["_vendored"]


def builtin_problems(doc: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(map(str, exc.path))
        return [f"{doc.get('kind')} {where}: {exc.message}"]
    return []


def problems(doc: dict[str, Any]) -> list[str]:
    """Every schema violation of one document (empty: valid)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in CRDS:
        return builtin_problems(doc)
    validator = crd_validator(*key)
    out = [
        f"{doc['kind']} {'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(doc)
    ]
    # the API server checks a custom object's metadata as ObjectMeta
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata", {})}
    out += builtin_problems(meta)
    if doc["kind"] == "JobSet":  # each replicated job's template is a batch/v1 JobTemplateSpec
        for rjob in doc.get("spec", {}).get("replicatedJobs", []):
            job = copy.deepcopy(rjob.get("template", {}))
            job.update(apiVersion="batch/v1", kind="Job")
            job.setdefault("metadata", {})["name"] = rjob.get("name", "x")
            out += builtin_problems(job)
    return out
