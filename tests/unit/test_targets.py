"""The shared ``_target_`` resolver: import path, one-line refusals, the standard-library guard."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from dtrain_cli.targets import TargetError, import_roots, resolve_target


@pytest.fixture
def user_pkg(tmp_path: Path):
    """A fresh package (unique name, so tests never see a cached module) in tmp_path."""
    name = f"userpkg_{uuid.uuid4().hex[:8]}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(
        "import os\n"
        "from os import system as run_shell\n"
        "class Net:\n"
        "    def __init__(self, width=4):\n"
        "        self.width = width\n"
        "    @staticmethod\n"
        "    def make():\n"
        "        return Net(2)\n"
        "def pairs():\n"
        "    return [1, 2]\n"
    )
    (pkg / "broken.py").write_text("import not_a_real_dependency_xyz\n")
    (pkg / "raises.py").write_text("raise RuntimeError('bad config\\n  on two lines')\n")
    yield name, str(tmp_path)
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def one_line_error(dotted: str, roots: list[str], key: str = "data._target_") -> str:
    with pytest.raises(TargetError) as e:
        resolve_target(dotted, key=key, roots=roots)
    text = str(e.value)
    assert "\n" not in text, text
    assert text.startswith(f"{key}={dotted}: "), text
    return text


def test_resolves_class_function_and_nested_attribute(user_pkg):
    name, root = user_pkg
    net = resolve_target(f"{name}.net.Net", key="model._target_", roots=[root])
    assert net.__name__ == "Net" and net(width=8).width == 8
    assert resolve_target(f"{name}.net.pairs", key="data._target_", roots=[root])() == [1, 2]
    make = resolve_target(f"{name}.net.Net.make", key="model._target_", roots=[root])
    assert make().width == 2
    assert sys.path[0] == root


def test_third_party_targets_resolve():
    assert resolve_target("omegaconf.OmegaConf", key="x._target_").__name__ == "OmegaConf"


def test_missing_module_names_it_and_the_roots(user_pkg, tmp_path):
    _, root = user_pkg
    text = one_line_error("nosuchpkg_abc.Bar", [root, "/conf"])
    assert (
        text
        == f"data._target_=nosuchpkg_abc.Bar: no module 'nosuchpkg_abc' (searched: {root}, /conf)"
    )
    name = user_pkg[0]
    text = one_line_error(f"{name}.nomodule.Bar", [root])
    assert f"no module '{name}.nomodule'" in text and root in text


def test_module_that_fails_to_import_gives_the_reason(user_pkg):
    name, root = user_pkg
    text = one_line_error(f"{name}.broken.Thing", [root])
    assert f"module '{name}.broken' does not import" in text
    assert "not_a_real_dependency_xyz" in text and root in text
    text = one_line_error(f"{name}.raises.Thing", [root])
    assert "RuntimeError: bad config on two lines" in text


def test_missing_attribute(user_pkg):
    name, root = user_pkg
    text = one_line_error(f"{name}.net.Nope", [root])
    assert text.endswith(f"'{name}.net' has no attribute 'Nope'")


@pytest.mark.parametrize("dotted", ["Net", "", "pkg..Net", "pkg.1bad", "pkg.net.Net()"])
def test_not_a_dotted_path(dotted):
    text = one_line_error(dotted, [])
    assert "expected a dotted path 'package.module.Name'" in text


@pytest.mark.parametrize(
    "dotted", ["os.system", "builtins.eval", "subprocess.run", "os.path.join", "shutil.rmtree"]
)
def test_standard_library_is_refused(dotted):
    text = one_line_error(dotted, [], key="train.loss._target_")
    assert "standard library or builtins" in text


def test_reexported_standard_library_is_refused(user_pkg):
    """A user module that re-exports ``os.system`` does not smuggle it past the guard."""
    name, root = user_pkg
    text = one_line_error(f"{name}.net.run_shell", [root])
    assert "resolves into the standard library or builtins ('posix')" in text or "('os')" in text
    text = one_line_error(f"{name}.net.os", [root])
    assert "standard library" in text


def test_import_roots_order_and_dedup(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    extra = tmp_path / "extra"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", str(extra), str(tmp_path), "rel"]))
    roots = import_roots([conf, str(tmp_path)])
    assert roots == [str(tmp_path), str(conf), str(extra), str(tmp_path / "rel")]
    assert all(Path(r).is_absolute() for r in roots)


def test_target_in_cwd_resolves_via_import_roots(tmp_path, monkeypatch):
    name = f"cwdmod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("class Pairs:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    obj = resolve_target(f"{name}.Pairs", key="data._target_", roots=import_roots())
    assert obj.__name__ == "Pairs"
    sys.modules.pop(name, None)
