"""``model=hf``: a transformers causal LM behind the model seam (CPU, gloo, fp32).

Unit: the model's own loss equals cross entropy on dtrain's (x, next tokens); pipeline stages
chained give the full model's logits with the full model's parameter names; ``export --format
hf`` loads back with ``from_pretrained``; every bad input is one line. On 2 gloo ranks (tensor
parallel, pipeline, FSDP of a tied model): tests/launch/test_hf_model.py.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dtrain_cli.errors import ConfigError
from dtrain_cli.models import model_spec
from dtrain_cli.models.hf import HFConfig, HFSpec
from dtrain_cli.models.hf.library import MISSING

VOCAB, T = 256, 32
LLAMA = {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 128,
}
GPT2 = {  # tied input/output embeddings (GPT-2's default); no dropout: comparable runs
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "vocab_size": VOCAB,
    "n_positions": 128,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
QWEN2_TIED = {**LLAMA, "tie_word_embeddings": True}
GPT_LIKE = {"n_layer": 2, "hidden_size": 64, "n_head": 4, "vocab_size": 256}
FAMILIES = {"llama": LLAMA, "gpt2": GPT2, "qwen2": QWEN2_TIED, "mistral": LLAMA}


@dataclass
class Stage:  # the fields of plan.StagePlan a split reads
    layers: list[int]
    embeddings: bool
    head: bool


def spec_of(model_type: str, **config: object) -> HFSpec:
    return HFSpec(
        HFConfig(model_type=model_type, config={**FAMILIES[model_type], **config}, block_size=T)
    )


def tokens(batch: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) as dtrain's data gives them: windows of T+1 tokens, y = x shifted by one."""
    w = torch.randint(0, VOCAB, (batch, T + 1), generator=torch.Generator().manual_seed(seed))
    return w[:, :-1], w[:, 1:]


def built(spec: HFSpec, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return spec.build("cpu")


def cfg_with(tp: int = 1, pp: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        parallel=SimpleNamespace(tp=tp, pp=pp), data=SimpleNamespace(source="text")
    )


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_model_loss_equals_cross_entropy_on_next_tokens(model_type):
    spec = spec_of(model_type)
    assert spec.default_loss() == "model"
    model = built(spec)
    x, y = tokens()
    logits = model(x).logits
    reference = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    assert torch.equal(spec.forward_loss(model, x, y), reference)
    assert torch.equal(spec.loss(model(x), y), reference)  # the pipeline's loss on logits
    assert abs(reference.item() - torch.log(torch.tensor(VOCAB * 1.0)).item()) < 0.5


def test_build_is_seeded_and_facts_match_the_built_model():
    spec = spec_of("llama")
    a, b = built(spec, 1), built(spec, 1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    facts = spec.facts()
    assert facts.num_params == sum(p.numel() for p in a.parameters())
    assert facts.num_layers == 4
    assert facts.params_per_layer == sum(p.numel() for p in a.model.layers[0].parameters())
    assert [type(u).__name__ for u in spec.fsdp_units(a)] == ["LlamaDecoderLayer"] * 4
    assert spec.vocab_size == VOCAB and spec.supports_tensor_parallel()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_pipeline_stages_chained_equal_the_full_model(model_type):
    spec = spec_of(model_type, **({"n_layer": 4} if model_type == "gpt2" else {}))
    model = built(spec).eval()
    x, _ = tokens()
    stages = [Stage([0, 1], True, False), Stage([1, 3], False, False), Stage([3, 4], False, True)]
    parts = [spec.pipeline_stage(model, s).eval() for s in stages]
    h = x
    for part in parts:
        h = part(h)
    assert torch.equal(h, model(x).logits)
    names = [set(p.state_dict()) for p in parts]
    assert set().union(*names) == set(model.state_dict())  # full-model names: DCP reshards
    assert not names[0] & names[1] and not names[1] & names[2]
    assert any(".layers.3." in n or ".h.3." in n for n in names[2])


def test_export_hf_loads_with_from_pretrained_and_gives_equal_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    for model_type in ("llama", "gpt2"):
        spec = spec_of(model_type)
        model = built(spec).eval()
        out = tmp_path / model_type
        files = spec.export(model, out, "hf")
        assert {"config.json", "model.safetensors"} <= {f.name for f in files}
        assert not list(tmp_path.glob(".*tmp"))
        loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
        x, _ = tokens()
        assert torch.equal(loaded(x).logits, model(x).logits)
        # and the folder is a valid model.pretrained: the same weights come back through dtrain
        again = HFSpec(HFConfig(pretrained=str(out), block_size=T)).build("cpu").eval()
        assert torch.equal(again(x).logits, model(x).logits)


def test_a_pretrained_folder_is_checked_against_what_the_command_line_says_of_it(tmp_path):
    """A llama folder ran as 'gpt2' by its label, model.config keys its config class does
    not take were dropped by from_pretrained without a word, and one that reshapes its
    weights trained the folder's first layers alone (num_hidden_layers=1 over 4) or failed
    at start-up after a LOAD REPORT (a new user's finds)."""
    import json

    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **LLAMA}))

    def problems(**kw):
        return HFSpec(HFConfig(pretrained=str(folder), **kw)).config_problems()

    assert problems() == [] and problems(model_type="llama") == []
    assert problems(config={"num_hidden_layers": 4, "max_position_embeddings": 512}) == []
    assert problems(config={"rope_theta": 5e5, "attention_dropout": 0.1}) == []
    assert problems(config={"num_hidden_layers": 1}) == [
        f"model.config.num_hidden_layers=1: model.pretrained={folder}'s config.json has "
        "num_hidden_layers=4, and its weights that shape (they would not load, or load in "
        "part); drop the key, or leave model.pretrained unset to train a new model of that "
        "shape"
    ]
    assert problems(config={"vocab_size": 300})[0].startswith("model.config.vocab_size=300: ")
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", **LLAMA, "head_dim": None})
    )
    assert problems(config={"head_dim": 16}) == []  # null in the folder: derived, not fixed
    assert problems(model_type="gpt2") == [
        f"model.model_type=gpt2: model.pretrained={folder} holds a llama model (its "
        "config.json); drop model.model_type"
    ]
    assert problems(config={"n_layer": 7, "n_embd": 8}) == [
        f"model.config.n_layer: not an argument of LlamaConfig, model.pretrained={folder}'s "
        "config (nor n_embd)"
    ]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (
            "three",
            "model.config.num_hidden_layers=three: Field 'num_hidden_layers' expected int, got str",
        ),
        (
            2.5,
            "model.config.num_hidden_layers=2.5: Field 'num_hidden_layers' expected int, got float",
        ),
    ],
)
def test_a_config_value_of_the_wrong_type_is_one_line(value, said):
    """transformers' strict config dataclasses raise huggingface_hub's own error type (not a
    ValueError): a traceback and exit 1 for model.config.num_hidden_layers=three."""
    with pytest.raises(ConfigError) as err:
        _ = spec_of("llama", num_hidden_layers=value).hf_config
    (line,) = err.value.problems
    assert line.startswith(said), line


def test_a_whole_config_dict_keeps_its_values_types_and_tilde_removes_an_entry():
    """model.config={num_hidden_layers:2,...} made every value a string (then 'expected int,
    got str'), and ~model.config.X set it to None (transformers' default lost)."""
    from dtrain_cli.config.compose import compose_config

    whole = "model.config={num_hidden_layers:2,hidden_size:64,rope_scaling:{factor:2.0}}"
    cfg = compose_config("llama_tiny_hf", [whole], validate=False)
    assert cfg.model.config == {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "rope_scaling": {"factor": 2.0},
    }
    cfg = compose_config("llama_tiny_hf", ["~model.config.max_position_embeddings"], validate=False)
    assert "max_position_embeddings" not in cfg.model.config
    env = compose_config("gpt_tiny", ["cluster.env={A:1}", "+cluster.env.B=2"], validate=False)
    assert env.cluster.env == {"A": "1", "B": "2"}  # dict[str, str]: strings still


def test_export_safetensors_still_works_for_hf(tmp_path):
    spec = spec_of("gpt2")
    files = spec.export(built(spec), tmp_path / "model.safetensors", "safetensors")
    assert [f.name for f in files] == ["model.safetensors", "model.json"]


# -- bad input: one line each, naming the key ----------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "tp", "pp", "expected"),
    [
        (
            lambda: spec_of("llama", num_attention_heads=6, hidden_size=96),
            4,
            1,
            "parallel.tp=4: must divide model.config.num_attention_heads=6",
        ),
        (
            lambda: spec_of("llama", num_key_value_heads=1),
            2,
            1,
            "parallel.tp=2: must divide model.config.num_key_value_heads=1",
        ),
        (
            lambda: spec_of("gpt2", tie_word_embeddings=False),
            2,
            1,
            "parallel.tp=2: model.model_type=gpt2 has no base_model_tp_plan",
        ),
        (
            lambda: HFSpec(
                HFConfig(
                    model_type="gpt_neox",
                    config={
                        "num_hidden_layers": 2,
                        "hidden_size": 64,
                        "num_attention_heads": 4,
                        "intermediate_size": 128,
                        "vocab_size": VOCAB,
                    },
                )
            ),
            1,
            2,
            "parallel.pp=2: model.model_type=gpt_neox has no pipeline split",
        ),
        (lambda: spec_of("qwen2"), 1, 2, "model.config.tie_word_embeddings=true: not supported"),
        (
            lambda: HFSpec(HFConfig(pretrained="/nonexistent/my-llama")),
            1,
            1,
            "model.pretrained=/nonexistent/my-llama: no such folder",
        ),
        (
            lambda: HFSpec(HFConfig(model_type="lama")),
            1,
            1,
            "model.model_type=lama: not a transformers",
        ),
        (lambda: HFSpec(HFConfig(model_type="t5")), 1, 1, "model.model_type=t5: has no causal LM"),
        (lambda: HFSpec(HFConfig()), 1, 1, "model.model_type: unset"),
        (
            lambda: spec_of("llama", num_layers=2),
            1,
            1,
            "model.config.num_layers: not an argument of LlamaConfig",
        ),
        (
            lambda: spec_of("llama", max_position_embeddings=16),
            1,
            1,
            "model.block_size=32: more than the model's max_position_embeddings=16",
        ),
        (  # transformers' own assert in nn.Embedding came out as a traceback
            lambda: HFSpec(HFConfig(model_type="phi3", config=LLAMA, block_size=T)),
            1,
            1,
            f"model.config.pad_token_id=32000: not below model.config.vocab_size={VOCAB} "
            "(phi3's default); set model.config.pad_token_id=0 (or null)",
        ),
        (
            lambda: HFSpec(HFConfig(model_type="bloom", config=GPT_LIKE, block_size=T)),
            1,
            1,
            "model.attn_implementation=sdpa: transformers' bloom does not support it; set "
            "model.attn_implementation=eager",
        ),
        (  # built, then failed in step 1 of a launch the plan accepted
            lambda: spec_of("llama", num_key_value_heads=3),
            1,
            1,
            "model.config.num_key_value_heads=3: must divide model.config.num_attention_heads=4"
            " (each key/value head serves heads / kv heads query heads); use one of [1, 2, 4]",
        ),
        (  # any other refusal of transformers': its words, in one line
            lambda: spec_of("llama", hidden_act="no_such_act"),
            1,
            1,
            "model.model_type=llama: transformers cannot build it from this config (KeyError: ",
        ),
    ],
)
def test_bad_input_is_one_line(spec, tp, pp, expected):
    problems = spec().problems(cfg_with(tp, pp))
    assert len(problems) == 1 and problems[0].startswith(expected), problems
    assert "\n" not in problems[0]


def test_good_layouts_have_no_problems():
    assert spec_of("llama").problems(cfg_with(tp=2, pp=2)) == []
    assert spec_of("gpt2").problems(cfg_with(pp=2, tp=1)) == [
        "model.config.tie_word_embeddings=true: not supported with tp > 1 or pp > 1 "
        "(the tied weight would live on two stages or in two layouts); set it false"
    ]
    assert spec_of("gpt2", tie_word_embeddings=False).problems(cfg_with(pp=2)) == []


def test_without_transformers_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    spec = model_spec(SimpleNamespace(model=HFConfig(model_type="llama")))
    with pytest.raises(ConfigError) as err:
        spec.facts()
    assert err.value.problems == [MISSING]
    assert spec.problems(cfg_with()) == [MISSING]


def test_config_vocab_size_reads_the_transformers_config():
    """The data layer and compose read ``cfg.model.vocab_size``: the transformers config's
    value, None (no error at compose time) while the config cannot be made."""
    assert HFConfig(model_type="llama", config={"vocab_size": 300}).vocab_size == 300
    assert HFConfig(model_type="gpt2").vocab_size == 50257
    assert HFConfig().vocab_size is None


def test_checkpointing_saves_and_tp_keeps_norms_whole_in_the_estimates():
    """Issue 24 #4: an HF model's checkpointed layer keeps only its input, and the
    parameters no tp style splits (norms) count whole on every tp rank."""
    spec = spec_of("llama")
    per_layer, _ = spec.activation_bytes(4, 4, 1)
    assert spec.checkpoint_bytes(4, 4, 1) == 4 * T * LLAMA["hidden_size"] * 4 < per_layer / 10
    model = built(spec)
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert spec.facts().params_tp_replicated == norms > 0  # llama: no biases
    from dtrain_cli.plan.layout import part_activations

    def kept(mode: str) -> int:
        c = SimpleNamespace(
            precision=SimpleNamespace(name="fp32"),
            parallel=SimpleNamespace(tp=1, activation_checkpointing=mode),
        )
        return part_activations(c, spec, 4, 0, LLAMA["num_hidden_layers"], True, True)[0]

    assert kept("full") < kept("selective") < kept("none")


def test_a_vocabulary_ten_times_the_data_s_is_a_warning_and_the_docs_example_sets_one():
    """Issue 24 #17: GPT-2's 50,257 tokens on byte-level data (196x) is a plan warning;
    the example the docs give sets a vocabulary the data matches."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.plan.build import build_plan
    from tests.conftest import REPO

    base = ["model=hf", "model.model_type=gpt2", "model.config.n_layer=2"]
    base += ["model.config.n_embd=64", "model.config.n_head=4"]
    (warning,) = [w for w in build_plan(compose_config("gpt_tiny", base)).warnings if "vocab" in w]
    assert warning == (
        "model.config.vocab_size=50,257: 196x the data's 256 tokens (byte-level tokens); the "
        "embedding and the output layer are that much larger than the data can use (slower "
        "steps, a higher starting loss); set model.config.vocab_size=256, or train on data of "
        "that vocabulary (data=tokens, data.tokenizer)"
    )
    fixed = build_plan(compose_config("gpt_tiny", [*base, "model.config.vocab_size=256"]))
    assert not [w for w in fixed.warnings if "vocab" in w]
    for doc in ("README.md", "docs/own-model.md"):
        lines = [x for x in (REPO / doc).read_text().splitlines() if "model_type=gpt2" in x]
        launches = [x for x in lines if x.startswith("dtrain launch")]
        assert launches and all("model.config.vocab_size=256" in x for x in launches), doc
    gpt = build_plan(compose_config("gpt_tiny", ["model.vocab_size=4096"]))  # 16x: any kind
    assert any(w.startswith("model.vocab_size=4,096: 16x the data's 256") for w in gpt.warnings)


def test_a_model_whose_class_names_no_loss_gets_the_causal_lm_loss_without_a_warning():
    """transformers reads a model's loss type off its class name: GPT2LMHeadModel has none,
    and every start of a gpt2 run printed "loss_type=None ... unrecognized" (a new user's
    find). The loss was already the causal LM's; now it is said to be."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    model = built(spec_of("gpt2"))
    assert model.loss_type == "ForCausalLM"
    assert model.loss_function is LOSS_MAPPING["ForCausalLM"]


def test_a_pretrained_models_vocabulary_is_not_a_key_to_set(tmp_path, hf_files):
    """With model.pretrained, the tokenizer-larger-than-vocabulary error said to set
    model.config.vocab_size, which a pretrained folder's weights refuse (a review's find):
    it says to use the model's own tokenizer."""
    import json

    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    corpus, tok, size = hf_files
    folder = tmp_path / "small-llama"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", **LLAMA, "vocab_size": 64})
    )
    args = ["plan", "model=hf", f"model.pretrained={folder}", "data=hf", f"data.path={corpus}",
            f"data.tokenizer={tok}"]  # fmt: skip
    said = " ".join(CliRunner().invoke(app, args).output.split())
    assert (
        f"error: data.tokenizer={tok}: {size} tokens, more than model.pretrained={folder}'s "
        f"vocabulary of 64; train it with its own tokenizer (data.tokenizer={folder}"
    ) in said
