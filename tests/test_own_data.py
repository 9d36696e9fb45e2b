"""Your own data: data=hf (JSONL + a locally trained tokenizer), data=custom, loader workers.

Multi-process checks (few, short): an hf run killed mid-epoch and resumed with 2 loader
workers equals the uninterrupted run with none, bitwise; a custom dataset trains under dp=2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dtrain_cli.config.compose import compose_config, config_from_yaml, config_to_yaml
from dtrain_cli.config.schema import DataConfig
from dtrain_cli.corpus.custom import build_custom
from dtrain_cli.corpus.hf import load_tokenizer, prepare_hf
from dtrain_cli.errors import ConfigError
from tests.conftest import REPO, Run, cache_dir, run_dtrain

# the user's module (tests/own_data.py) on the import path, as PYTHONPATH puts it
WITH_TESTS = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
WORDS = [
    "the",
    "a",
    "model",
    "trains",
    "on",
    "data",
    "every",
    "rank",
    "sees",
    "same",
    "samples",
    "resume",
    "stays",
    "exact",
    "loss",
    "falls",
    "tokens",
    "pack",
    "into",
    "windows",
    "of",
    "block",
    "size",
    "plus",
    "one",
    "batch",
    "step",
    "epoch",
    "seed",
]


def write_corpus(path: Path, records: int = 430, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i in range(records):
            words = rng.choice(WORDS, size=int(rng.integers(6, 14)))
            f.write(json.dumps({"id": i, "text": " ".join(words) + "."}) + "\n")
    return path


def train_tokenizer(corpus: Path, folder: Path, vocab_size: int = 120) -> int:
    """A BPE tokenizer trained here on the corpus, saved as tokenizer.json (+ its config)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<eos>"])
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    tok.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return tok.get_vocab_size(with_added_tokens=True)


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory) -> tuple[Path, Path, int]:
    root = tmp_path_factory.mktemp("hfdata")
    corpus = write_corpus(root / "corpus.jsonl")
    vocab = train_tokenizer(corpus, root / "tok")
    return corpus, root / "tok", vocab


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
        ("tests.own_data.Stream", {}, "built a Stream, not a map-style dataset"),
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


# -- the loader: the stream decides the samples, not the worker count ------------------------
def _batches(source, workers: int, dp_rank: int = 0):
    import torch

    from dtrain_cli.runtime.data.loader import Batches
    from dtrain_cli.runtime.data.stream import BatchLayout

    layout = BatchLayout(micro_batch_size=3, grad_accum=2, dp=2, dp_rank=dp_rank)
    data = DataConfig(num_workers=workers, prefetch_factor=2 if workers else None)
    return Batches(source, layout, 7, torch.device("cpu"), data)


@pytest.mark.parametrize("target", ["tests.own_data.Pairs", "tests.own_data.DictPairs"])
def test_workers_and_restarts_give_the_stream_samples(target):
    import torch

    from dtrain_cli.runtime.data.stream import SampleStream

    source = build_custom(DataConfig(source="custom", _target_=target, kwargs={"n": 40}))["train"]
    order = [(s, k) for s in range(4) for k in range(2)]
    main, pool, ranked = _batches(source, 0), _batches(source, 2), _batches(source, 2, 1)
    stream = SampleStream(len(source), 7)
    for step, k in order:
        x0, y0 = main.micro_batch(step, k)
        x2, y2 = pool.micro_batch(step, k)
        x0 = x0["inputs"] if isinstance(x0, dict) else x0
        x2 = x2["inputs"] if isinstance(x2, dict) else x2
        assert torch.equal(x0, x2) and torch.equal(y0, y2)
        idx = stream.indices(main.layout.micro_start(step, k), 3)
        want = torch.stack([source[int(i)]["inputs" if "Dict" in target else 0] for i in idx])
        assert torch.equal(x0, want)
        xr, _ = ranked.micro_batch(step, k)  # dp rank 1: the next 3 stream positions
        xr = xr["inputs"] if isinstance(xr, dict) else xr
        assert not torch.equal(xr, x0)
    again, _ = pool.micro_batch(1, 1)  # a restart (resume) at any micro-step
    main.close(), pool.close(), ranked.close()
    ref, _ = _batches(source, 0).micro_batch(1, 1)
    again = again["inputs"] if isinstance(again, dict) else again
    ref = ref["inputs"] if isinstance(ref, dict) else ref
    assert torch.equal(again, ref)


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
    (["plan", "data.num_workers=-1"], "data.num_workers=-1: must be >= 0"),
    (["launch", "data=custom", "data._target_=tests.own_data.Stream"], "not a map-style"),
    (["launch", "data=custom", "data._target_=tests.own_data.Failing"], "cannot open shard 1"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_bad_data_exit_2_one_line_nothing_written(args, message, hf_files, tmp_path, monkeypatch):
    corpus, tok_dir, _ = hf_files
    bad_tok = tmp_path / "badtok"
    bad_tok.mkdir()
    (bad_tok / "tokenizer.json").write_text("{not json")
    args = [a.replace("CORPUS", str(corpus)) for a in args]
    args = [a.replace("BADTOK", str(bad_tok)).replace("TOK", str(tok_dir)) for a in args]
    argv = [args[0], "recipe=gpt_tiny", *args[1:]]
    if args[0] == "plan":  # in-process: the CLI's own entry point, imports paid once
        from typer.testing import CliRunner

        from dtrain_cli.cli.app import app

        monkeypatch.chdir(tmp_path)
        result = CliRunner().invoke(app, argv)
        code, stderr = result.exit_code, result.stderr
        assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    else:  # a launch starts the fork server: its own process
        run = run_dtrain(argv, tmp_path, 120, WITH_TESTS)
        code, stderr = run.returncode, run.stderr
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert message in lines[0] and "Traceback" not in stderr
    assert not (tmp_path / "runs").exists()


# -- training: hf resume bitwise with loader workers, custom under dp=2 ---------------------
def hf_args(corpus: Path, tok_dir: Path) -> list[str]:
    # ~140 train windows of 33 tokens: 20 steps of 8 samples cross an epoch, so the resume
    # at step 10 is mid-epoch (checked below)
    return [
        "recipe=gpt_tiny",
        "data=hf",
        f"data.path={corpus}",
        f"data.tokenizer={tok_dir}",
        # covers the tokenizer's ~110 tokens; 256 keeps the head's shape that the
        # checkpoint tests resume bitwise (with 108 or 128, main's resume differs by 1 ulp
        # in some steps' loss, with data=tokens on the same token files too)
        "model.vocab_size=256",
        "model.block_size=32",
        "train.steps=20",
        "train.global_batch_size=8",
        "train.micro_batch_size=2",
        "logging.every=1",
        "checkpoint.every_steps=10",
        "train.eval_every=10",
        "optim.warmup_steps=2",
        "logging.tensorboard=false",
        "dp=2",
        "debug.replica_check_at_end=true",  # param_digest in summary.json
    ]


def losses(run: Run, kind: str = "train") -> list[tuple[int, float]]:
    key = "loss" if kind == "train" else "val_loss"
    return [(r["step"], r[key]) for r in run.metrics(kind)]


@pytest.mark.multiproc
def test_hf_resume_mid_epoch_with_workers_is_bitwise(hf_files, tmp_path):
    corpus, tok_dir, _ = hf_files
    args = hf_args(corpus, tok_dir)
    data = DataConfig(source="hf", path=str(corpus), tokenizer=str(tok_dir))
    train = np.fromfile(prepare_hf(data, cache_dir(), 256)["train"], dtype=np.uint16)
    assert 80 < (len(train) - 1) // 32 < 160  # step 10 = sample 80: mid-epoch, then a new one
    for name in ("ref", "killed"):
        (tmp_path / name).mkdir()
    ref = run_dtrain(["launch", *args], tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    killed = run_dtrain(
        ["launch", *args, "data.num_workers=2", "data.prefetch_factor=3"],
        tmp_path / "killed",
        env={"DTRAIN_FAULTS": "kill:step=13:rank=0"},
    )
    assert killed.returncode != 0 and killed.run_dir is not None
    done = run_dtrain(["resume", "--ckpt", str(killed.run_dir)], tmp_path / "killed")
    done.run_dir = killed.run_dir
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.summary()["resumed_from"] == "step_000010"
    assert losses(done) == losses(ref)  # workers and the resume change nothing, bitwise
    assert losses(done, "val") == losses(ref, "val")
    assert done.summary()["param_digest"] == ref.summary()["param_digest"]
    assert losses(ref)[-1][1] < losses(ref)[0][1]


@pytest.mark.multiproc
def test_custom_dataset_trains_under_dp2(tmp_path):
    run = run_dtrain(
        [
            "launch",
            "recipe=gpt_tiny",
            "data=custom",
            "data._target_=tests.own_data.Pairs",
            "++data.n=96",
            "++data.block_size=32",
            "model.block_size=32",
            "train.steps=12",
            "train.global_batch_size=8",
            "optim.warmup_steps=2",
            "optim.base_lr=3e-3",
            "logging.every=1",
            "train.eval_every=12",
            "logging.tensorboard=false",
            "debug.replica_check_at_end=true",  # replicas_identical in summary.json
            "data.num_workers=1",
            "dp=2",
        ],
        tmp_path,
        env=WITH_TESTS,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    curve = [loss for _, loss in losses(run)]
    assert len(curve) == 12 and curve[-1] < 0.9 * curve[0]
    summary = run.summary()
    assert summary["replicas_identical"] and np.isfinite(summary["val_loss"])
