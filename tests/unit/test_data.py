"""Corpora and the deterministic, rank-aware global sample stream."""

from __future__ import annotations

import numpy as np
import pytest

from dtrain_cli.config.schema import DataConfig
from dtrain_cli.corpus.prepare import prepare_corpus
from dtrain_cli.models.gpt import GPTConfig as ModelConfig
from dtrain_cli.runtime.data.stream import (
    BatchLayout,
    SampleStream,
    TokenWindows,
    open_splits,
)


def rank_positions(step: int, micro: int, accum: int, dp: int) -> list[int]:
    out = []
    for r in range(dp):
        layout = BatchLayout(micro, accum, dp, r)
        for k in range(accum):
            start = layout.micro_start(step, k)
            out += list(range(start, start + micro))
    return out


@pytest.mark.parametrize(
    ("micro", "accum", "dp"), [(8, 1, 1), (4, 2, 1), (4, 1, 2), (2, 2, 2), (1, 1, 8)]
)
def test_union_over_ranks_is_the_single_process_stream(micro, accum, dp):
    global_batch = micro * accum * dp
    for step in range(5):
        positions = rank_positions(step, micro, accum, dp)
        assert sorted(positions) == list(range(step * global_batch, (step + 1) * global_batch))
        assert len(set(positions)) == len(positions)  # distinct samples per rank


def test_stream_is_a_seeded_permutation_per_epoch():
    s = SampleStream(100, seed=7)
    epoch0, epoch1 = s.indices(0, 100), s.indices(100, 100)
    assert sorted(epoch0) == list(range(100)) and sorted(epoch1) == list(range(100))
    assert not np.array_equal(epoch0, epoch1)
    again = SampleStream(100, seed=7)
    assert np.array_equal(again.indices(150, 10), s.indices(150, 10))  # position is the state
    assert not np.array_equal(SampleStream(100, seed=8).indices(0, 100), epoch0)
    assert np.array_equal(s.indices(95, 10), np.concatenate([epoch0[95:], epoch1[:5]]))


def test_builtin_corpus_is_the_stdlib(tmp_path):
    cfg = DataConfig(source="builtin", cache_dir=str(tmp_path))
    paths = prepare_corpus(cfg)
    train = np.memmap(paths["train"], dtype=np.uint16, mode="r")
    val = np.memmap(paths["val"], dtype=np.uint16, mode="r")
    assert len(train) > 1_000_000 and 0.08 < len(val) / (len(train) + len(val)) < 0.12
    assert b"def " in train[:100_000].astype(np.uint8).tobytes()
    mtime = paths["train"].stat().st_mtime_ns
    assert prepare_corpus(cfg) == paths and paths["train"].stat().st_mtime_ns == mtime  # cached


def test_text_folder_and_windows(tmp_path):
    src = tmp_path / "text"
    src.mkdir()
    (src / "a.txt").write_text("hello world " * 200)
    (src / "b.md").write_text("more text " * 200)
    cfg = DataConfig(source="text", path=str(src), cache_dir=str(tmp_path / "cache"))
    splits = open_splits(cfg, ModelConfig(block_size=16), seed=0)
    w = splits["train"]
    batch = w.gather(np.array([0, 3]))
    assert batch.shape == (2, 17)
    assert bytes(batch[0].astype(np.uint8)) == bytes(w.tokens[:17].astype(np.uint8))
    assert batch[1, 0] == w.tokens[3 * 16]


def test_pretokenized_bin_folder(tmp_path):
    tokens = np.arange(5000, dtype=np.uint16) % 1000
    tokens.tofile(tmp_path / "train.bin")
    tokens[:500].tofile(tmp_path / "val.bin")
    cfg = DataConfig(source="tokens", path=str(tmp_path))
    splits = open_splits(cfg, ModelConfig(block_size=32, vocab_size=1000), seed=0)
    assert len(splits["train"]) == (5000 - 1) // 32
    with pytest.raises(ValueError, match=r"token id 999 >= model\.vocab_size=256"):
        open_splits(cfg, ModelConfig(block_size=32, vocab_size=256), seed=0)


def test_missing_data_path_is_named(tmp_path):
    cfg = DataConfig(source="text", path=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="nope"):
        prepare_corpus(cfg)


def test_windows_need_enough_tokens(tmp_path):
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="fewer than one window"):
        TokenWindows.open(tmp_path / "t.bin", "uint16", block_size=32, vocab_size=256)
