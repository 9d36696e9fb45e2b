"""The plan's facts of a Hugging Face model from the data cache (models/hf/facts_cache.py):
a record is the meta-device build's facts exactly, a hit gives the same plan, and a record
is found only for the config (and the transformers, torch and counting code) it was made for.
"""

from __future__ import annotations

import json
import sys

import pytest

from dtrain_cli.config.compose import compose_config
from dtrain_cli.errors import ConfigError
from dtrain_cli.models import model_spec
from dtrain_cli.models.hf import HFConfig, facts_cache, spec
from dtrain_cli.models.hf.library import MISSING
from dtrain_cli.plan.build import build_plan

RECIPES = ["llama_tiny_hf", "gpt2_tiny_hf"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRAIN_CACHE", str(tmp_path))
    monkeypatch.setattr(spec, "_RECORDS", {})
    return tmp_path


def records(cache) -> list:
    return sorted((cache / facts_cache.FOLDER).glob("*.json"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recorded_plan_equals_the_meta_build_s(recipe, cache):
    cfg = compose_config(recipe, ["dp=2"])
    built = build_plan(cfg)  # a miss: transformers config and meta build, then recorded
    (path,) = records(cache)
    spec._RECORDS.clear()
    from dtrain_cli.models.hf.net import plan_facts

    fresh = model_spec(cfg)
    assert fresh._known() is not None  # read back from the file
    record = json.loads(path.read_text())
    assert record["meta"] == json.loads(json.dumps(plan_facts(fresh)))
    assert record["meta"]["saved"]["block_float"] > 0  # measured under fake tensors
    assert record["model_type"] == str(fresh.hf_config.model_type)
    assert record["vocab_size"] == fresh.hf_config.vocab_size
    assert record["tied"] == bool(fresh.hf_config.tie_word_embeddings)
    assert build_plan(cfg).to_yaml() == built.to_yaml()  # a hit: the same plan
    assert model_spec(cfg).facts() == fresh.facts()


def test_a_record_is_only_for_its_config(cache):
    four = build_plan(compose_config("llama_tiny_hf", ["dp=2"])).estimates.num_params
    cfg = compose_config("llama_tiny_hf", ["dp=2", "model.config.num_hidden_layers=2"])
    assert model_spec(cfg)._known() is None
    assert model_spec(cfg).facts().num_layers == 2
    assert build_plan(cfg).estimates.num_params < four
    assert len(records(cache)) == 2
    window = compose_config("llama_tiny_hf", ["dp=2", "model.block_size=64"])
    assert model_spec(window)._known() is None  # what a window saves depends on its length
    other = dict(model_spec(cfg).cfg.config)
    key = facts_cache.facts_key
    options = {"model_type": "llama", "pretrained": None, "config": other, "attn": "sdpa"}
    assert key(options) != key({**options, "attn": "eager"})


def test_a_spoiled_record_is_a_miss_and_an_unwritable_cache_no_failure(cache, monkeypatch):
    cfg = compose_config("llama_tiny_hf", ["dp=2"])
    build_plan(cfg)
    (path,) = records(cache)
    path.write_text("{not json")
    spec._RECORDS.clear()
    assert model_spec(cfg)._known() is None
    monkeypatch.setenv("DTRAIN_CACHE", str(path / "below-a-file"))
    spec._RECORDS.clear()
    assert build_plan(cfg).estimates.num_params > 0


def test_a_problem_is_never_recorded_and_without_transformers_one_line(cache, monkeypatch):
    bad = compose_config("llama_tiny_hf", ["dp=2", "tp=3"], validate=False)
    with pytest.raises(ConfigError):
        build_plan(bad)
    assert len(records(cache)) == 1  # the config is fine; the layout is not
    unknown = HFConfig(model_type="llama", config={"num_layers": 2})
    assert model_spec(type("Run", (), {"model": unknown})()).problems(bad) != []
    assert len(records(cache)) == 1
    spec._RECORDS.clear()
    monkeypatch.setitem(sys.modules, "transformers", None)
    hf = model_spec(compose_config("llama_tiny_hf", ["dp=2"]))
    with pytest.raises(ConfigError) as err:
        hf.facts()
    assert err.value.problems == [MISSING]


def test_a_local_folder_s_record_follows_its_config_json(cache, tmp_path):
    import transformers

    folder = tmp_path / "my-llama"
    conf = transformers.AutoConfig.for_model(
        "llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=256
    )
    conf.save_pretrained(folder)
    options = {"model_type": None, "pretrained": str(folder), "config": {}, "attn": "sdpa"}
    before = facts_cache.facts_key(options)
    facts_cache._key.cache_clear()
    assert facts_cache.facts_key(options) == before
    conf.num_hidden_layers = 3
    conf.save_pretrained(folder)
    facts_cache._key.cache_clear()
    assert facts_cache.facts_key(options) not in (before, None)
    cfg = compose_config(
        "gpt_tiny", ["model=hf", f"model.pretrained={folder}", "model.block_size=64"]
    )
    assert model_spec(cfg).facts().num_layers == 3 and len(records(cache)) == 1
    spec._RECORDS.clear()
    assert model_spec(cfg)._known()["meta"]["num_layers"] == 3
