"""What a pod's ``dtrain agent RUN_DIR --init-from /etc/dtrain`` does before anything else:
the run dir on the run volume gets the ConfigMap's config.yaml and plan.yaml. Torch-free.

Every pod does it at once, on a volume they share: each file is written under a name of
its own and renamed into place (atomic), so no pod reads half a file. A restart finds the
files already there: they must be the ConfigMap's, byte for byte, or the run dir holds
another run (a reused ``run.name``) and the pod stops with one line instead of mixing two
runs' checkpoints.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from dtrain_cli.launch.k8s.job import RUN_FILES


def init_run_dir(run_dir: Path, source: Path) -> list[str]:
    """Copy :data:`RUN_FILES` from ``source`` into ``run_dir`` (created with ``logs/``);
    returns problems, one line each."""
    texts = {}
    for name in RUN_FILES:
        try:
            texts[name] = (source / name).read_text()
        except OSError as exc:
            return [f"--init-from {source}: cannot read {name} ({exc.strerror or exc})"]
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [f"{run_dir}: cannot create the run dir ({exc.strerror or exc})"]
    for name, text in texts.items():
        path = run_dir / name
        if path.exists():
            if path.read_text() != text:
                return [
                    f"{path} differs from {source / name}: {run_dir} holds another run; "
                    "choose another run.name"
                ]
            continue
        tmp = run_dir / f".{name}.{socket.gethostname()}.{os.getpid()}.tmp"
        tmp.write_text(text)
        tmp.replace(path)
    return []
