"""``dtrain plan`` of a Hugging Face model whose facts are in the data cache imports neither
torch nor transformers, and prints the plan the meta-device build gave."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PLAN = (
    "import sys\n"
    "from dtrain_cli.cli.app import app\n"
    "try:\n"
    "    app(['plan', 'recipe=llama_tiny_hf', 'dp=2'])\n"
    "except SystemExit as e:\n"
    "    assert e.code in (0, None), e.code\n"
    "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
)


@pytest.mark.multiproc
def test_a_cached_hf_plan_imports_no_torch_and_prints_the_same_plan(tmp_path):
    env = {**os.environ, "DTRAIN_CACHE": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", PLAN], capture_output=True, text=True, check=True, env=env
        )
        for _ in range(2)
    ]
    first, second = (r.stdout.splitlines() for r in runs)
    assert first[-1] == "['torch', 'transformers']"  # the miss: a meta-device build
    assert second[-1] == "[]"  # the hit
    assert first[:-1] == second[:-1] and any("853,120 parameters" in line for line in first)
