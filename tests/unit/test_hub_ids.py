"""A Hugging Face Hub id where dtrain reads a local path (``model.pretrained=gpt2``,
``data.path=wikitext``, ``data.tokenizer=gpt2``) said only "no such folder"; the error now
names the Hub's download command and the setting to give after it. A path stays a path."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.hub import download_hint, looks_like_hub_id


@pytest.mark.parametrize("value", ["gpt2", "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B"])
def test_hub_ids_are_recognised(value):
    assert looks_like_hub_id(value)


@pytest.mark.parametrize(
    "value", ["./model", "/models/llama", "~/m", "corpus.jsonl", "a/b/c", "shard.parquet", ""]
)
def test_paths_and_file_names_are_not(value):
    assert not looks_like_hub_id(value)
    assert download_hint("data.path", value) == ""


def _plan_error(*overrides: str) -> str:
    result = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", *overrides])
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    return line


def test_a_hub_model_id_is_told_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = _plan_error("model=hf", "model.pretrained=meta-llama/Llama-3.2-1B")
    assert said == (
        "error: model.pretrained=meta-llama/Llama-3.2-1B: no such folder (a local model "
        "folder); dtrain reads local files (no rank downloads): for a Hugging Face Hub id, "
        "fetch it once with `hf download meta-llama/Llama-3.2-1B --local-dir "
        "models/Llama-3.2-1B`, then model.pretrained=models/Llama-3.2-1B"
    )
    assert _plan_error("model=hf", "model.pretrained=./nowhere").endswith(
        "no such folder (a local model folder)"
    )


def test_a_hub_dataset_and_tokenizer_are_told_how_to_fetch_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = _plan_error("data=hf", "data.path=wikitext")
    assert "`hf download wikitext --repo-type dataset --local-dir data/wikitext`" in said
    assert said.endswith("then data.path=data/wikitext (or the folder of one split's files in it)")
    (tmp_path / "corpus.jsonl").write_text('{"text": "hello"}\n')
    said = _plan_error("data=hf", "data.path=corpus.jsonl", "data.tokenizer=gpt2")
    assert said.endswith(
        "`hf download gpt2 --local-dir models/gpt2`, then data.tokenizer=models/gpt2"
    )
