"""Your own data: data=hf (JSONL + a locally trained tokenizer), data=custom, loader workers.

Loader workers, the launches (an hf run killed mid-epoch and resumed with 2 loader workers
equals the uninterrupted run with none, bitwise; a custom dataset trains under dp=2) and the
bad inputs a launch refuses: tests/launch/test_own_data.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dtrain_cli.config.compose import compose_config, config_from_yaml, config_to_yaml
from dtrain_cli.config.schema import DataConfig
from dtrain_cli.corpus.custom import build_custom
from dtrain_cli.corpus.hf import load_tokenizer, prepare_hf
from dtrain_cli.errors import ConfigError
from tests.conftest import REPO

# the user's module (tests/own_data.py) on the import path, as PYTHONPATH puts it
WITH_TESTS = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


# -- data=hf: tokenize once, cache, same tokens as the tokenizer ----------------------------
def test_hf_jsonl_is_tokenized_with_the_local_tokenizer_and_cached(hf_files, tmp_path):
    corpus, tok_dir, vocab = hf_files
    data = DataConfig(source="hf", path=str(corpus), tokenizer=str(tok_dir), val_fraction=0.1)
    paths = prepare_hf(data, tmp_path, vocab)
    tokens = np.concatenate([np.fromfile(paths[s], dtype=np.uint16) for s in ("train", "val")])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    eos = tok.token_to_id("<eos>")
    expected: list[int] = []
    for line in corpus.read_text().splitlines():
        if expected:
            expected.append(eos)
        expected += tok.encode(json.loads(line)["text"], add_special_tokens=False).ids
    assert tokens.tolist() == expected
    assert len(np.fromfile(paths["val"], dtype=np.uint16)) == int(len(expected) * 0.1)
    mtime = paths["train"].stat().st_mtime_ns
    assert prepare_hf(data, tmp_path, vocab) == paths  # cached: not tokenized again
    assert paths["train"].stat().st_mtime_ns == mtime
    byte_paths = prepare_hf(DataConfig(source="hf", path=str(corpus)), tmp_path, 256)
    assert byte_paths["train"].parent != paths["train"].parent  # keyed by the tokenizer
    first = json.loads(corpus.read_text().splitlines()[0])["text"].encode()
    assert np.fromfile(byte_paths["train"], dtype=np.uint16)[: len(first)].tolist() == list(first)


def test_hf_vocab_and_text_field_errors_are_one_line(hf_files, tmp_path):
    corpus, tok_dir, vocab = hf_files
    data = DataConfig(source="hf", path=str(corpus), tokenizer=str(tok_dir))
    with pytest.raises(ConfigError) as e:
        prepare_hf(data, tmp_path, vocab - 1)
    assert e.value.problems == [
        f"model.vocab_size={vocab - 1}: below the tokenizer's {vocab} tokens "
        f"(data.tokenizer={tok_dir}); set model.vocab_size={vocab} or more"
    ]
    with pytest.raises(ConfigError, match=r"data.text_field=body: not a column .*id, text"):
        prepare_hf(DataConfig(source="hf", path=str(corpus), text_field="body"), tmp_path, 256)


def test_hf_parquet_and_text_folders(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["héllo", "world"]}), tmp_path / "a.parquet")
    data = DataConfig(source="hf", path=str(tmp_path), text_field="body", val_fraction=0.2)
    paths = prepare_hf(data, tmp_path / "cache", 256)
    tokens = np.concatenate([np.fromfile(paths[s], dtype=np.uint16) for s in ("train", "val")])
    assert bytes(tokens.astype(np.uint8)) == "héllo\n\nworld".encode()
    txt = tmp_path / "txt"
    txt.mkdir()
    (txt / "b.txt").write_text("second file\n")
    (txt / "a.txt").write_text("first\nfile\n")
    paths = prepare_hf(DataConfig(source="hf", path=str(txt)), tmp_path / "cache", 256)
    tokens = np.concatenate([np.fromfile(paths[s], dtype=np.uint16) for s in ("train", "val")])
    assert bytes(tokens.astype(np.uint8)) == b"first\nfile\n\n\nsecond file\n"


def test_byte_level_tokenizer_is_the_default():
    tok = load_tokenizer(None)
    assert tok.vocab_size == 256 and tok.encode_batch(["é"]) == [[0xC3, 0xA9]]


# -- data=custom: composition, building, the validation split -------------------------------
def test_custom_keys_fold_into_kwargs_and_round_trip(tmp_path):
    cfg = compose_config(
        "gpt_tiny", ["data=custom", "data._target_=tests.own_data.Pairs", "++data.n=40"]
    )
    assert cfg.data.source == "custom" and cfg.data.kwargs == {"n": 40}
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg))
    assert config_from_yaml(tmp_path / "config.yaml").data.kwargs == {"n": 40}
    splits = build_custom(cfg.data)
    assert (len(splits["train"]), len(splits["val"])) == (36, 4)
    x, y = splits["val"][0]
    ref_x, _ = splits["train"].dataset[36]
    assert (x == ref_x).all() and (x[1:] == y[:-1]).all()


def test_resume_may_change_the_loader_workers_not_the_data():
    from dataclasses import replace

    from dtrain_cli.config.resume_changes import unsafe_resume_changes

    old = compose_config("gpt_tiny", [])
    workers = replace(old, data=replace(old.data, num_workers=2, prefetch_factor=4))
    assert unsafe_resume_changes(old, workers) == []
    other = replace(old, data=replace(old.data, val_fraction=0.2))
    assert [line.split(":")[0] for line in unsafe_resume_changes(old, other)] == [
        "data.val_fraction=0.2"
    ]


def test_custom_val_target_and_function_target():
    data = DataConfig(
        source="custom",
        _target_="tests.own_data.make_pairs",
        val_target="tests.own_data.DictPairs",
        kwargs={"n": 10, "block_size": 8},
    )
    splits = build_custom(data)
    assert len(splits["train"]) == 10 and sorted(splits["val"][0]) == ["inputs", "targets"]


@pytest.mark.parametrize(
    ("target", "kwargs", "message"),
    [
        ("tests.own_data.Stream", {}, "Stream: an IterableDataset, not a map-style dataset"),
        ("tests.own_data.Numbers", {}, "item 0 is a int; items must be (inputs, targets)"),
        ("tests.own_data.Failing", {"n": 3}, "failed: ValueError: cannot open shard 3 second"),
        ("tests.own_data.Pairs", {"n": 0}, "the dataset is empty"),
        ("tests.own_data.Pairs", {"n": 1}, "1 items leave none for training"),
        ("tests.own_data.NOT_CALLABLE", {}, "is a int, not a class or function"),
    ],
)
def test_custom_dataset_refusals(target, kwargs, message):
    with pytest.raises(ConfigError) as e:
        build_custom(DataConfig(source="custom", _target_=target, kwargs=kwargs))
    (line,) = e.value.problems
    assert "\n" not in line and message in line and line.startswith("data.")


# -- every bad input: exit 2, one line, nothing written -------------------------------------
BAD = [
    (["plan", "data=text", "data.path=/nope/corpus.txt"], "data.path=/nope/corpus.txt: no such"),
    (["plan", "data=tokens", "data.path=/tmp"], "data.path=/tmp: a folder without train.bin"),
    (["plan", "data=hf", "data.path=/nope/c.jsonl"], "data.path=/nope/c.jsonl: no such file"),
    (["plan", "data=hf", "data.path=CORPUS", "data.tokenizer=/nope/tok"], "data.tokenizer=/nope"),
    (
        ["plan", "data=hf", "data.path=CORPUS", "data.tokenizer=TOK", "model.vocab_size=100"],
        "model.vocab_size=100: below the tokenizer's",
    ),
    (["plan", "data=hf", "data.path=CORPUS", "data.text_field=body"], "not a field of"),
    (["plan", "data=hf", "data.path=CORPUS", "data.tokenizer=/tmp"], "no tokenizer.json or"),
    (["plan", "data=hf", "data.path=CORPUS", "data.tokenizer=BADTOK"], "does not load"),
    (["plan", "data=custom", "data._target_=os.system"], "standard library or builtins"),
    (["plan", "data=custom", "data._target_=nosuch_mod.Pairs"], "no module 'nosuch_mod'"),
    (["plan", "data=custom", "data._target_=tests.own_data.Nope"], "has no attribute 'Nope'"),
    (
        [
            "plan",
            "data=custom",
            "data._target_=tests.own_data.Pairs",
            "++data.f._target_=os.getcwd",
        ],
        "data.f._target_=os.getcwd: targets in the standard library",
    ),
    (["plan", "++data.n=3"], "only data=custom takes extra keys"),
    # refused by the launch's build only, before: the plan said nothing
    (
        ["plan", "data=custom", "data._target_=tests.own_data.Pairs", "++data.nn=3"],
        "data._target_=tests.own_data.Pairs: Pairs() got an unexpected keyword argument 'nn' "
        "(it takes data.n",
    ),
    (
        ["plan", "data=custom", "data._target_=tests.own_data.Stream"],
        "data._target_=tests.own_data.Stream: an IterableDataset, not a map-style dataset",
    ),
    # set, but never read by the source chosen: the run trained on the built-in corpus
    (["plan", "data.path=CORPUS"], "only read by data=text, data=tokens or data=hf"),
    (["plan", "data=synthetic", "data.tokenizer=TOK"], "only read by data=hf"),
    (["plan", "data.num_workers=-1"], "data.num_workers=-1: must be >= 0"),
]
# the launch ones (a launch starts the fork server: its own process): tests/launch/test_own_data.py


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_bad_data_exit_2_one_line_nothing_written(args, message, hf_files, tmp_path, monkeypatch):
    corpus, tok_dir, _ = hf_files
    bad_tok = tmp_path / "badtok"
    bad_tok.mkdir()
    (bad_tok / "tokenizer.json").write_text("{not json")
    args = [a.replace("CORPUS", str(corpus)) for a in args]
    args = [a.replace("BADTOK", str(bad_tok)).replace("TOK", str(tok_dir)) for a in args]
    argv = [args[0], "recipe=gpt_tiny", *args[1:]]
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(tmp_path)  # in-process: the CLI's own entry point, imports paid once
    result = CliRunner().invoke(app, argv)
    code, stderr = result.exit_code, result.stderr
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert message in lines[0] and "Traceback" not in stderr
    assert not (tmp_path / "runs").exists()
