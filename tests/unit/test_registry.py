"""The registry both seams share (strategies, sync modes): every entry module is found."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest


def test_an_entry_imported_first_does_not_hide_the_others(tmp_path, monkeypatch):
    """Importing one entry's module before anyone asked for names (``simulate/expect`` takes
    a helper from ``sync_modes/param_server``) registered that entry alone, and discovery
    took the registry as done: ``sync.mode=diloco: not allowed; choose one of param_server``."""
    pkg = tmp_path / "seam_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text(
        textwrap.dedent(
            """
            from dtrain_cli.registry import Registry
            REGISTRY = Registry(
                package="seam_pkg", key="seam", order=lambda cls: 0, unknown=ValueError
            )
            """
        )
    )
    for name in ("first", "second"):
        (pkg / f"{name}.py").write_text(
            "from seam_pkg.base import REGISTRY\n\n"
            f"@REGISTRY.register\nclass E:\n    name = {name!r}\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("seam_pkg.second")  # one entry, directly
        registry = importlib.import_module("seam_pkg.base").REGISTRY
        assert registry.names() == ("first", "second")
        with pytest.raises(
            ValueError, match="seam=third: not allowed; choose one of first, second"
        ):
            registry.get("third")
        with pytest.raises(ValueError, match=r"seam=secnod: not allowed \(did you mean 'second'"):
            registry.get("secnod")
    finally:
        for mod in [m for m in sys.modules if m == "seam_pkg" or m.startswith("seam_pkg.")]:
            del sys.modules[mod]
