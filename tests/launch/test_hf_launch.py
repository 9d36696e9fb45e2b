"""``dtrain launch recipe=llama_tiny_hf`` under every layout equals one process; the tied
``gpt2_tiny_hf`` trains under FSDP and exports to a folder ``from_pretrained`` loads; resume
at another dp continues the curve; bad HF input is one line and exit 2 (CPU, gloo, fp32).

SGD (no momentum): sharded and tensor-parallel runs compare within rounding, which Adam
would amplify on parameters with a zero gradient (TORCH_CPU_FACTS.md)."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from tests.conftest import Run, launch, run_dtrain

STEPS = 4
SHORT = [
    f"train.steps={STEPS}",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "logging.every=1",
    "train.eval_every=0",
    "logging.tensorboard=false",
    "optim=sgd",
    "optim.base_lr=0.2",
    "optim.base_batch_size=8",
    "optim.warmup_steps=0",
    "optim.grad_clip=1.0",
]
LLAMA = ["recipe=llama_tiny_hf", *SHORT]
runner = CliRunner()


def losses(run: Run) -> list[float]:
    return [r["loss"] for r in run.metrics()]


@pytest.fixture(scope="session")
def llama_dp1(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return launch(tmp_path_factory, "hf_dp1", *LLAMA, "checkpoint.every_steps=2")


@pytest.mark.multiproc
@pytest.mark.parametrize(
    "layout",
    [
        ["dp=2"],
        ["dp=2", "parallel.strategy=fsdp"],
        ["tp=2"],
        ["pp=2"],
        ["dp=2", "pp=2", "train.micro_batch_size=1"],  # 4 micro-batches per schedule call
    ],
    ids=lambda layout: "-".join(layout),
)
def test_llama_layouts_reproduce_the_single_process_curve(layout, llama_dp1, tmp_path_factory):
    run = launch(tmp_path_factory, "hf_" + "_".join(layout), *LLAMA, *layout)
    ref, got = losses(llama_dp1), losses(run)
    assert len(got) == len(ref) == STEPS
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-5, (layout, got, ref)
    assert ref[-1] < ref[0]
    rel = abs(run.summary()["param_sum"] - llama_dp1.summary()["param_sum"])
    assert rel < 1e-4 * max(1.0, abs(llama_dp1.summary()["param_sum"]))


@pytest.mark.multiproc
def test_resume_at_another_dp_continues_the_curve(llama_dp1, tmp_path):
    run_dir = tmp_path / "runs" / llama_dp1.run_dir.name
    shutil.copytree(llama_dp1.run_dir, run_dir)  # resume writes into the run dir
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert ckpt.is_dir(), sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    resumed = run_dtrain(["resume", "--ckpt", str(ckpt), "dp=2"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = {r["step"]: r["loss"] for r in resumed.metrics()}
    ref = {r["step"]: r["loss"] for r in llama_dp1.metrics()}
    assert sorted(got) == list(range(1, STEPS + 1))
    assert max(abs(got[s] - ref[s]) for s in (3, 4)) < 1e-5, (got, ref)


@pytest.mark.multiproc
def test_tied_gpt2_trains_under_fsdp_and_exports_to_from_pretrained(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    run = launch(
        tmp_path_factory, "hf_gpt2", "recipe=gpt2_tiny_hf", *SHORT, "dp=2", "parallel.strategy=fsdp"
    )
    curve = losses(run)
    assert len(curve) == STEPS and curve[-1] < curve[0], curve
    out = run.run_dir.parent.parent / "exported"
    done = run_dtrain(
        ["export", "--ckpt", str(run.run_dir), "--format", "hf", "--out", str(out)],
        run.run_dir.parent.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "Writing model shards" not in done.stderr  # transformers' bar for one file
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    assert abs(total - run.summary()["param_sum"]) < 1e-6 * max(1.0, abs(total))
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    assert model(x).logits.shape == (2, 16, 256)


# -- bad input: exit 2, one line, before any process starts --------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["recipe=llama_tiny_hf", "tp=3"], "parallel.tp=3: must divide"),
        (
            ["recipe=llama_tiny_hf", "tp=4", "model.config.num_key_value_heads=1"],
            "model.config.num_key_value_heads=1",
        ),
        (["recipe=gpt2_tiny_hf", "pp=2"], "model.config.tie_word_embeddings=true"),
        (
            ["model=hf", "model.model_type=gpt_neox", "model.config.num_hidden_layers=2", "pp=2"],
            "parallel.pp=2: model.model_type=gpt_neox has no pipeline split",
        ),
        (["model=hf", "model.pretrained=/nonexistent/my-llama"], "no such folder"),
        (["model=hf", "model.model_type=lama"], "model.model_type=lama: not a transformers"),
    ],
)
def test_bad_hf_input_exit_2_one_line(args, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["launch", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and expected in result.output, result.output
    assert [line for line in result.output.splitlines() if expected in line]
    assert not (tmp_path / "runs").exists()


def test_model_hf_without_transformers_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    result = runner.invoke(app, ["launch", "recipe=llama_tiny_hf"])
    assert result.exit_code == 2, result.output
    assert "model=hf needs transformers: pip install 'dtrain[hf]'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.multiproc
def test_fine_tune_local_pretrained_weights_on_hf_data(tmp_path):
    """The README's fine-tuning command: local weights (model.pretrained) and a local
    tokenizer folder (data=hf). With a 1e-9 LR (clipped SGD) the run ends with the saved
    weights to ~1e-6, where another init differs by ~10: they, not a random init, trained."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from dtrain_cli.models.hf import HFConfig, HFSpec
    from tests.unit.test_hf_model import LLAMA

    folder = tmp_path / "my-llama"
    torch.manual_seed(3)
    model = HFSpec(HFConfig(model_type="llama", config=LLAMA, block_size=32)).build("cpu")
    model.save_pretrained(folder)
    saved = sum(p.detach().double().sum().item() for p in model.parameters())
    texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"])
    )
    tok.save(str(folder / "tokenizer.json"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    run = run_dtrain(
        [
            "launch",
            "model=hf",
            f"model.pretrained={folder}",
            "model.block_size=32",
            "data=hf",
            f"data.path={corpus}",
            f"data.tokenizer={folder}",
            *SHORT,
            "optim.base_lr=1e-9",
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert len(losses(run)) == STEPS
    assert abs(run.summary()["param_sum"] - saved) < 1e-4
    # named as its run dir is (my-llama-<time>), not after the default recipe's values
    assert "dtrain my-llama: 1 process(es)" in run.stdout
    assert run.run_dir.name.startswith("my-llama-")
    assert "Loading weights" not in run.stdout + run.stderr  # transformers' bar, per rank
