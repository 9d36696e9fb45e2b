"""A small JSONL corpus and a BPE tokenizer trained on it here: the ``data=hf`` inputs of
tests/unit/test_own_data.py and tests/launch/test_own_data.py (the ``hf_files`` fixture of
tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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
