"""Compositions kept on disk (dtrain_cli/config/compose_cache.py): a repeat composes
nothing and gives the same config; any change to what a composition reads is a miss."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dtrain_cli import source_stats
from dtrain_cli.config import compose, compose_cache
from dtrain_cli.config.compose import compose_config, compose_dictconfig
from dtrain_cli.errors import ConfigError

OVERRIDES = ["dp=2", "train.steps=7", "optim.base_lr=3e-4", "model=gpt_small"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DTRAIN_CACHE", str(tmp_path / "cache"))
    compose._COMPOSED.clear()  # the in-process memo of Hydra's part: none from other tests
    return tmp_path / "cache" / compose_cache.FOLDER


def composes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The recipes composed from now on (every miss checks its overrides and composes)."""
    calls: list[str] = []
    real = compose._compose_checked

    def counted(recipe_path, *args):
        calls.append(recipe_path.stem)
        return real(recipe_path, *args)

    monkeypatch.setattr(compose, "_compose_checked", counted)
    return calls


def user_dir(root: Path, steps: int) -> Path:
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    (root / "recipes" / "mine.yaml").write_text(
        "# dtrain launch recipe=mine --config-dir DIR\n# my own recipe\n"
        f"defaults:\n  - base\n  - _self_\ntrain:\n  steps: {steps}\n"
    )
    return root


def test_a_repeat_composes_nothing_and_gives_the_same_config(cache, monkeypatch):
    first = compose_dictconfig("gpt_tiny", OVERRIDES)
    assert len(list(cache.glob("composed-*.pkl"))) == 1
    compose._COMPOSED.clear()  # as in a new process
    hydra = []
    monkeypatch.setattr(compose, "_hydra_compose", lambda *a: hydra.append(a))
    calls = composes(monkeypatch)
    again = compose_dictconfig("gpt_tiny", OVERRIDES)
    assert calls == [] and hydra == []
    assert OmegaConf.to_container(again) == OmegaConf.to_container(first)
    assert OmegaConf.is_struct(again)  # unknown keys are still refused, as composed
    typed = compose_config("gpt_tiny", OVERRIDES)
    assert typed.parallel.dp == 2 and typed.train.steps == 7 and typed.model.n_layer > 2
    assert typed.run.recipe == "gpt_tiny" and typed.run.recipe_named


def test_other_overrides_and_edited_files_are_misses(cache, monkeypatch, tmp_path):
    conf = user_dir(tmp_path / "conf", steps=3)
    assert compose_config("mine", [], [conf]).train.steps == 3
    calls = composes(monkeypatch)
    assert compose_config("mine", ["train.steps=4"], [conf]).train.steps == 4
    assert calls == ["mine"]  # other overrides: composed
    compose._COMPOSED.clear()
    user_dir(conf, steps=5)  # the recipe edited (another size)
    assert compose_config("mine", [], [conf]).train.steps == 5
    assert calls == ["mine", "mine"]


def test_a_change_of_dtrain_code_is_a_miss(cache, monkeypatch, tmp_path):
    code = source_stats.code_files()
    assert Path(compose.__file__).with_name("schema.py") in code  # the schema's fields
    assert Path(compose.__file__).parent.parent / "models" / "gpt" / "__init__.py" in code
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "schema.py").write_text("x = 1\n")
    monkeypatch.setattr(source_stats, "CODE_ROOT", tmp_path / "pkg")
    compose_dictconfig("gpt_tiny", ["dp=2"])
    compose._COMPOSED.clear()
    calls = composes(monkeypatch)
    (tmp_path / "pkg" / "schema.py").write_text("x = 22\n")
    compose_dictconfig("gpt_tiny", ["dp=2"])
    assert calls == ["gpt_tiny"]


def test_problems_and_interpolations_are_not_kept(cache, monkeypatch):
    with pytest.raises(ConfigError, match=r"optim\.bogus_lr"):
        compose_dictconfig("gpt_tiny", ["optim.bogus_lr=1"])
    monkeypatch.setenv("STEPS_FROM_ENV", "9")
    cfg = compose_config("gpt_tiny", ["train.steps=${oc.env:STEPS_FROM_ENV}"])
    assert cfg.train.steps == 9
    assert list(cache.glob("composed-*.pkl")) == []  # (Hydra's merge alone is kept)


def test_an_unreadable_entry_is_composed_again(cache, monkeypatch):
    compose_dictconfig("gpt_tiny", ["dp=2"])
    (entry,) = cache.glob("composed-*.pkl")
    entry.write_bytes(entry.read_bytes()[:100])  # cut short
    compose._COMPOSED.clear()
    calls = composes(monkeypatch)
    assert compose_config("gpt_tiny", ["dp=2"]).parallel.dp == 2
    assert calls == ["gpt_tiny"]
    assert len(entry.read_bytes()) > 100  # written again, whole


def test_the_folder_keeps_the_newest_entries(cache, monkeypatch):
    monkeypatch.setattr(compose_cache, "KEEP", 2)
    for steps in (1, 2, 3):
        compose_dictconfig("gpt_tiny", [f"train.steps={steps}"])
    assert len(list(cache.glob("*.pkl"))) == 2
    calls = composes(monkeypatch)
    compose_dictconfig("gpt_tiny", ["train.steps=3"])  # the newest is kept
    assert calls == []


def test_other_values_compose_no_groups_again(cache, monkeypatch):
    """Hydra's merge of the recipe and its group options is kept too: a command that
    changes only values sets them on it; another group option is merged anew."""
    compose_dictconfig("gpt_tiny", ["dp=2", "model=gpt_small"])
    compose._COMPOSED.clear()  # as in a new process
    merged: list[list[str]] = []
    real = compose._hydra_compose
    monkeypatch.setattr(
        compose, "_hydra_compose", lambda r, s, chosen: merged.append(chosen) or real(r, s, chosen)
    )
    calls = composes(monkeypatch)
    cfg = compose_config("gpt_tiny", ["dp=4", "model=gpt_small", "train.steps=9"])
    assert calls == ["gpt_tiny"] and merged == []  # checked and set, not merged again
    assert (cfg.parallel.dp, cfg.train.steps, cfg.model.n_layer) == (4, 9, 8)
    compose._COMPOSED.clear()
    assert compose_config("gpt_tiny", ["dp=4"]).model.n_layer == 4  # the recipe's own model
    assert merged == [[]]


def test_a_repeat_reads_the_typed_config_back(cache, monkeypatch):
    first = compose_config("gpt_tiny", OVERRIDES)
    (entry,) = cache.glob("typed-*.pkl")
    compose._COMPOSED.clear()  # as in a new process
    monkeypatch.setattr(compose, "compose_dictconfig", lambda *a: pytest.fail("composed"))
    again = compose_config("gpt_tiny", OVERRIDES)
    assert again == first and again is not first
    again.train.steps = 1  # the caller's own copy: the next read is as composed
    assert compose_config("gpt_tiny", OVERRIDES).train.steps == 7
    entry.write_bytes(b"not a pickle")  # unreadable: composed again, not an error
    monkeypatch.undo()
    monkeypatch.setenv("DTRAIN_CACHE", str(cache.parent))
    assert compose_config("gpt_tiny", OVERRIDES) == first


def test_what_is_set_after_composing_is_part_of_the_typed_key(cache, monkeypatch, tmp_path):
    named = compose_config("gpt_tiny", ["dp=2"])
    default = compose_config(compose.DefaultRecipe("gpt_tiny"), ["dp=2"])
    assert named.run.recipe_named and not default.run.recipe_named
    monkeypatch.chdir(tmp_path)  # _target_ modules import from another folder
    moved = compose_config("gpt_tiny", ["dp=2"])
    assert moved.run.import_roots[0] == str(tmp_path.resolve())
    assert named.run.import_roots[0] != moved.run.import_roots[0]
    assert len(list(cache.glob("typed-*.pkl"))) == 3


def test_a_recipe_that_interpolates_is_not_kept_typed(cache, monkeypatch, tmp_path):
    """A value resolved from the environment follows the environment on every command."""
    conf = tmp_path / "conf"
    (conf / "recipes").mkdir(parents=True)
    (conf / "recipes" / "envy.yaml").write_text(
        "defaults:\n  - base\n  - _self_\ntrain:\n  steps: ${oc.env:ENVY_STEPS}\n"
    )
    monkeypatch.setenv("ENVY_STEPS", "3")
    assert compose_config("envy", [], [conf]).train.steps == 3
    monkeypatch.setenv("ENVY_STEPS", "4")
    assert compose_config("envy", [], [conf]).train.steps == 4
    assert list(cache.glob("typed-*.pkl")) == []


def test_one_composition_reads_the_files_stats_once(cache, monkeypatch, tmp_path):
    """A miss computes three keys (typed, composed, groups) over the same files: their stats
    are read once (each reading is about 4.5 ms on 2 cores). The next composition reads
    them again, so an edit made in between is seen; one that fails leaves no reading."""
    walks: list[int] = []
    real = compose_cache.code_files
    monkeypatch.setattr(compose_cache, "code_files", lambda: walks.append(1) or real())
    compose_config("gpt_tiny", ["train.seed=11"])  # a miss of all three
    assert len(list(cache.glob("*.pkl"))) == 3 and len(walks) == 1
    compose_config("gpt_tiny", ["train.seed=12"])  # typed and composed miss, groups hit
    assert len(walks) == 2
    mine = user_dir(tmp_path / "user", steps=5)
    assert compose_config("mine", [], [mine]).train.steps == 5
    user_dir(tmp_path / "user", steps=6)  # edited between two commands
    assert compose_config("mine", [], [mine]).train.steps == 6
    with pytest.raises(ConfigError):
        compose_config("gpt_tiny", ["train.stepz=1"])
    assert compose_cache._READINGS == []
