"""``dtrain k8s --dry-run`` in a fresh interpreter: it imports neither torch nor the
``kubernetes`` client. The API calls against the fake server: tests/unit/test_k8s_api.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.test_k8s_api import JOB


def test_dry_run_imports_neither_torch_nor_the_kubernetes_client(tmp_path):
    code = (
        "import sys\n"
        "from dtrain_cli.cli.app import app\n"
        f"args = {[*JOB, '--dry-run']!r}\n"
        "try:\n"
        "    app(args)\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print('LOADED', sorted(m for m in ('torch', 'kubernetes') if m in sys.modules),"
        " file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert "kind: JobSet" in out.stdout
    assert out.stderr.strip().endswith("LOADED []")
    assert not list(Path(tmp_path).iterdir())  # a dry run writes nothing
