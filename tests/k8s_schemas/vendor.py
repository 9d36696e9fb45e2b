"""Vendor a CRD's openAPIV3Schema for tests/k8s_schema.py (descriptions removed: they
are a third of the size and validate nothing).

    git -C jobset show v0.12.0:config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml > crd.yaml
    python tests/k8s_schemas/vendor.py crd.yaml tests/k8s_schemas/jobset_v1alpha2.json \\
        kubernetes-sigs/jobset config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml \\
        v0.12.0 f22e565ac3cc3265c7c45ef67ecffdc689af5d77
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def strip(node: object, field_names: bool = False) -> object:
    """``node`` without its ``description`` keywords (``field_names``: ``node`` is a
    ``properties`` map, whose keys are field names, kept whatever they are)."""
    if isinstance(node, dict):
        return {
            k: strip(v, k == "properties" and not field_names)
            for k, v in node.items()
            if field_names or k != "description"
        }
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main(crd: str, out: str, repo: str, path: str, tag: str, commit: str) -> None:
    doc = yaml.safe_load(Path(crd).read_text())
    (version,) = doc["spec"]["versions"]
    header = {
        "source": f"https://github.com/{repo}/blob/{tag}/{path}",
        "repository": repo,
        "path": path,
        "tag": tag,
        "commit": commit,
        "group": doc["spec"]["group"],
        "version": version["name"],
        "kind": doc["spec"]["names"]["kind"],
        "note": "spec.versions[0].schema.openAPIV3Schema, 'description' fields removed "
        "(tests/k8s_schemas/vendor.py); the CRD's license applies (Apache-2.0)",
    }
    body = {"_vendored": header, "openAPIV3Schema": strip(version["schema"]["openAPIV3Schema"])}
    Path(out).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
