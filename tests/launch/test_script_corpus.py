"""Scripts in the shapes real projects have (tests/scripts/corpus/), each run under
``torchrun --standalone --nproc-per-node 2`` and under ``dtrain run dp=2 --`` in the same
test, and compared: exit code, what the script printed, the final loss (seeded scripts:
the same arithmetic gives the same number), ``torch.get_num_threads()`` and the rest of
what a rank sees (start method, torchrun's variables). Wall time is compared in
bench/ (``bench/run.py``), not here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import DTRAIN, REPO, run_reference

CORPUS = REPO / "tests" / "scripts" / "corpus"
TORCHRUN = Path(sys.executable).parent / "torchrun"
# lines whose figures depend on the clock: the HF Trainer's runtime and rate summary
GLUED = re.compile(r"(?<=[.!?])(?=[A-Z])")
CLOCK = re.compile(r"runtime|per_second|it/s|s/it")


@dataclass(kw_only=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    ranks: list[dict]


def _launch(command: list[str], cwd: Path, out: Path) -> Outcome:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    if command[0] == str(TORCHRUN):  # the reference: see run_reference
        proc = run_reference(command, cwd=cwd, env=env, timeout=300)
    else:
        proc = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, env=env, timeout=300
        )
    missing = [r for r in range(2) if not (out / f"rank_{r}.json").exists()]
    assert not missing, (
        f"rank(s) {missing} wrote nothing; exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    )
    ranks = [json.loads((out / f"rank_{r}.json").read_text()) for r in range(2)]
    return Outcome(
        returncode=proc.returncode,
        stdout=proc.stdout,
        stderr=proc.stderr,
        ranks=ranks,
    )


def _script_lines(stdout: str) -> list[str]:
    """What the script printed, in any order (ranks interleave), without dtrain's own
    header and closing lines and the clock-dependent ones."""
    # Two ranks writing one pipe can glue lines ("...rank 1.Finished ... rank 0."): print()
    # writes the text and its newline separately, under torchrun as under dtrain.
    lines = [part for line in stdout.splitlines() for part in GLUED.split(line) if part.strip()]
    lines = [line for line in lines if not line.startswith(("dtrain ", "done: "))]
    return sorted(line for line in lines if not CLOCK.search(line))


def run_both(tmp_path: Path, script: str, *args: str) -> tuple[Outcome, Outcome]:
    """The same script and arguments (``{out}`` filled per launcher) under both launchers."""
    outcomes = []
    for name in ("torchrun", "dtrain"):
        cwd = tmp_path / name
        cwd.mkdir()
        out = cwd / "out"
        argv = [str(CORPUS / script), *(a.replace("{out}", str(out)) for a in args)]
        if name == "torchrun":
            command = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", *argv]
        else:
            command = [*DTRAIN, "run", "dp=2", "--", *argv]
        outcomes.append(_launch(command, cwd, out))
    return outcomes[0], outcomes[1]


def assert_same(ref: Outcome, got: Outcome, *, loss_tol: float = 0.0) -> None:
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    assert _script_lines(got.stdout) == _script_lines(ref.stdout)
    for rank, (a, b) in enumerate(zip(ref.ranks, got.ranks, strict=True)):
        assert b["threads"] == a["threads"], f"rank {rank}: torch threads"
        assert b["interop_threads"] == a["interop_threads"], f"rank {rank}: interop threads"
        assert b["start_method"] == a["start_method"], f"rank {rank}: multiprocessing"
        # but the agent-store flag, kept to the rank's own init_process_group (the
        # processes a script starts must host their own store: test_script_own_rendezvous)
        assert a["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        expected = {**a["env"], "TORCHELASTIC_USE_AGENT_STORE": None}
        assert b["env"] == expected, f"rank {rank}: torchrun's variables"
        if a["loss"] is not None:
            assert b["loss"] == pytest.approx(a["loss"], abs=loss_tol, rel=0), f"rank {rank}"
        extra = {k: v for k, v in a.items() if k not in ("loss", "pid", "env")}
        assert {k: b[k] for k in extra} == extra, f"rank {rank}"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local model folder as a user has one: config.json and a trained tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_llama")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([f"the quick brown fox {i} jumps" for i in range(200)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")
    fast.pad_token = fast.eos_token
    fast.save_pretrained(folder)
    LlamaConfig(
        vocab_size=fast.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ).save_pretrained(folder)
    return folder


CASES = {
    "env_init_exit": ("env_init_exit.py", "{out}"),
    "elastic_env": ("elastic_env.py", "{out}"),
    "loader_workers": ("loader_workers.py", "{out}"),
    "hydra_train": ("hydra_train.py", "steps=4", "lr=0.2", "out={out}", "hydra.run.dir=hydra"),
    "accelerate_loop": ("accelerate_loop.py", "--out", "{out}"),
    "lightning_ddp": ("lightning_ddp.py", "--out", "{out}"),
}


@pytest.mark.multiproc
@pytest.mark.parametrize("case", list(CASES))
def test_script_runs_as_under_torchrun(tmp_path: Path, case: str) -> None:
    ref, got = run_both(tmp_path, *CASES[case])
    assert_same(ref, got)


@pytest.mark.multiproc
def test_hf_trainer_script_runs_as_under_torchrun(tmp_path: Path, tiny_llama: Path) -> None:
    ref, got = run_both(tmp_path, "hf_trainer.py", "--model_dir", str(tiny_llama), "--out", "{out}")
    assert_same(ref, got)
    assert len(got.ranks[0]["losses"]) == 4 and got.ranks[0]["world"] == 2
